//! Compile the server's own protos (Envoy's RLS, the peer protocol) with a
//! vendored `protoc`, so a fresh machine needs nothing installed; also emit
//! the descriptor set that gRPC reflection serves. The public `sluice.v1`
//! protos are the `sluice-api` crate's, shared with the client. And list
//! the config types' fields with their doc comments for the config
//! reference.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let protoc = protoc_bin_vendored::protoc_bin_path()?;
    // SAFETY: build scripts are single-threaded; nothing else reads the env.
    unsafe { std::env::set_var("PROTOC", protoc) };
    let out = std::path::PathBuf::from(std::env::var("OUT_DIR")?);
    // google/protobuf/*.proto, shipped with the vendored protoc.
    let include = protoc_bin_vendored::include_path()?;
    let include = include.to_str().ok_or("non-UTF-8 include path")?;
    tonic_prost_build::configure()
        .file_descriptor_set_path(out.join("sluice_descriptor.bin"))
        .compile_protos(
            &["proto/envoy/service/ratelimit/v3/rls.proto"],
            &["proto", include],
        )?;
    // The peer protocol is not for apps: compiled apart, so reflection
    // (which serves the descriptor set above) does not advertise it.
    tonic_prost_build::configure()
        .compile_protos(&["proto/sluice/peer/v1/peer.proto"], &["proto"])?;
    println!("cargo:rerun-if-changed=proto");
    config_fields(&out)?;
    Ok(())
}

/// The config types' fields, in order, with their doc comments: what `sluice
/// config defaults` prints (`src/config/reference.rs`). Written as
/// `(struct, field, type, doc)` rows to `$OUT_DIR/config_fields.rs`; fields
/// the config no longer writes (`skip_serializing`: removed, accepted for
/// old files) are left out.
fn config_fields(out: &std::path::Path) -> Result<(), Box<dyn std::error::Error>> {
    let mut rows = String::from("&[\n");
    for file in ["src/config.rs", "src/tls.rs"] {
        println!("cargo:rerun-if-changed={file}");
        let ast = syn::parse_file(&std::fs::read_to_string(file)?)?;
        for item in ast.items {
            let syn::Item::Struct(s) = item else { continue };
            let syn::Fields::Named(fields) = s.fields else {
                continue;
            };
            for f in fields.named {
                let serde = |name: &str| {
                    f.attrs.iter().any(|a| {
                        let mut found = false;
                        if a.path().is_ident("serde") {
                            let _ = a.parse_nested_meta(|m| {
                                found |= m.path.is_ident(name);
                                if m.input.peek(syn::Token![=]) {
                                    m.value()?.parse::<syn::Expr>()?;
                                }
                                Ok(())
                            });
                        }
                        found
                    })
                };
                if serde("skip_serializing") || serde("skip") {
                    continue;
                }
                let ty = type_name(&f.ty);
                // A field with a default of its own reads as optional.
                let ty = if serde("default") && !ty.starts_with("Option<") {
                    format!("Option<{ty}>")
                } else {
                    ty
                };
                let doc: Vec<String> = f
                    .attrs
                    .iter()
                    .filter_map(|a| match &a.meta {
                        syn::Meta::NameValue(nv) if nv.path.is_ident("doc") => match &nv.value {
                            syn::Expr::Lit(syn::ExprLit {
                                lit: syn::Lit::Str(s),
                                ..
                            }) => Some(s.value().trim().to_string()),
                            _ => None,
                        },
                        _ => None,
                    })
                    .collect();
                let name = f.ident.map(|i| i.to_string()).unwrap_or_default();
                rows += &format!(
                    "    ({:?}, {:?}, {:?}, {:?}),\n",
                    s.ident.to_string(),
                    name,
                    ty,
                    doc.join("\n")
                );
            }
        }
    }
    rows += "]\n";
    std::fs::write(out.join("config_fields.rs"), rows)?;
    Ok(())
}

/// A type as its path's last segments: `Option<PathBuf>`,
/// `BTreeMap<String, PolicyConfig>`.
fn type_name(ty: &syn::Type) -> String {
    let syn::Type::Path(p) = ty else {
        return "?".into();
    };
    let Some(last) = p.path.segments.last() else {
        return "?".into();
    };
    let mut s = last.ident.to_string();
    if let syn::PathArguments::AngleBracketed(args) = &last.arguments {
        let inner: Vec<String> = args
            .args
            .iter()
            .filter_map(|a| match a {
                syn::GenericArgument::Type(t) => Some(type_name(t)),
                _ => None,
            })
            .collect();
        s += &format!("<{}>", inner.join(", "));
    }
    s
}
