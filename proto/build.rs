//! Compiles `proto/generate.proto` with protox (a protobuf compiler in Rust), so building
//! needs no `protoc` on the machine.
fn main() -> Result<(), Box<dyn std::error::Error>> {
    let proto = "proto/generate.proto";
    println!("cargo:rerun-if-changed={proto}");
    let descriptors = protox::compile([proto], ["proto"])?;
    tonic_prost_build::configure()
        // One type per concept: the proto's LogprobsMode is also `--logprobs-mode`'s value
        // (launcher, router) and the `logprobs_mode` field of TGI requests.
        .enum_attribute(
            "sonde.generate.v1.LogprobsMode",
            "#[derive(clap::ValueEnum, serde::Serialize, serde::Deserialize)]\n\
             #[serde(rename_all = \"lowercase\")]",
        )
        .compile_fds(descriptors)?;
    Ok(())
}
