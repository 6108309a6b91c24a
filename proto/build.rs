//! Compiles `gpufleet/v1/*.proto` (and Prometheus's remote-write messages,
//! `prometheus/remote.proto`) with protox (pure Rust), so no system `protoc` is needed.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let files = ["gpufleet/v1/agent.proto", "prometheus/remote.proto"];
    for f in files {
        println!("cargo:rerun-if-changed={f}");
    }
    let fds = protox::compile(files, ["."])?;
    tonic_prost_build::configure()
        .build_client(true)
        .build_server(true)
        // Prost's encoder; a decoder that reads each message as one slice (src/codec.rs).
        .codec_path("crate::codec::SliceCodec")
        .compile_fds(fds)?;
    Ok(())
}
