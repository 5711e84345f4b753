//! Generates the etcd client (`lock/src/etcd/client.rs` includes it) from payonce's own
//! subset of etcd's gRPC API, `proto/etcd.proto`. protox compiles the proto in Rust, so a
//! build needs no `protoc` installed: a plain `cargo build` has the etcd lock.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let proto = "proto/etcd.proto";
    println!("cargo:rerun-if-changed={proto}");
    let descriptors = protox::compile([proto], ["proto"])?;
    tonic_prost_build::configure()
        .build_server(false)
        .build_transport(false)
        .compile_fds(descriptors)?;
    Ok(())
}
