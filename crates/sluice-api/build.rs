//! Compile the public protos with a vendored `protoc` (a fresh machine needs
//! nothing installed), and emit their descriptor set for gRPC reflection.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let protoc = protoc_bin_vendored::protoc_bin_path()?;
    // SAFETY: build scripts are single-threaded; nothing else reads the env.
    unsafe { std::env::set_var("PROTOC", protoc) };
    let out = std::path::PathBuf::from(std::env::var("OUT_DIR")?);
    let include = protoc_bin_vendored::include_path()?;
    let include = include.to_str().ok_or("non-UTF-8 include path")?;
    tonic_prost_build::configure()
        .file_descriptor_set_path(out.join("sluice_api_descriptor.bin"))
        .compile_protos(
            &[
                "../../proto/sluice/v1/ratelimit.proto",
                "../../proto/sluice/v1/admin.proto",
                "../../proto/sluice/v1/allotments.proto",
            ],
            &["../../proto", include],
        )?;
    println!("cargo:rerun-if-changed=../../proto/sluice/v1");
    Ok(())
}
