//! Compile the server's own protos (Envoy's RLS, the peer protocol) with a
//! vendored `protoc`, so a fresh machine needs nothing installed; also emit
//! the descriptor set that gRPC reflection serves. The public `sluice.v1`
//! protos are the `sluice-api` crate's, shared with the client.

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
    Ok(())
}
