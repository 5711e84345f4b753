//! Generates the etcd client (`lock/src/etcd/client.rs` includes it) from payonce's own
//! subset of etcd's gRPC API, `proto/etcd.proto` — only in a build with the `etcd` feature,
//! so a build without etcd compiles no proto and no gRPC stack. protox compiles the proto
//! in Rust, so a build needs no `protoc` installed.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-changed=build.rs");
    #[cfg(feature = "etcd")]
    {
        let proto = "proto/etcd.proto";
        println!("cargo:rerun-if-changed={proto}");
        let descriptors = protox::compile([proto], ["proto"])?;
        tonic_prost_build::configure()
            .build_server(false)
            .build_transport(false)
            .compile_fds(descriptors)?;
    }
    Ok(())
}
