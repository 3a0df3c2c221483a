//! Sonde's router <-> shard gRPC protocol, compiled once for both sides.
//!
//! `proto/generate.proto` is the source of truth and documents every field.

/// Generated messages, client and server of `sonde.generate.v1`.
pub mod v1 {
    #![allow(clippy::all, missing_docs)]
    tonic::include_proto!("sonde.generate.v1");
}

pub use v1::*;

mod options;
pub use options::{Device, FlagValue, WeightQuant};

use std::path::{Path, PathBuf};

use tonic::transport::{Channel, Endpoint};

/// Where shards listen unless told otherwise: shard `r` on `<prefix>-<r>` (TGI's naming).
/// The launcher's, router's, shard's and bench's defaults all come from here.
pub const DEFAULT_SHARD_UDS_PREFIX: &str = "/tmp/sonde-shard";

/// The shard's own default socket: rank 0 under [`DEFAULT_SHARD_UDS_PREFIX`].
pub fn default_shard_socket() -> PathBuf {
    shard_socket(Path::new(DEFAULT_SHARD_UDS_PREFIX), 0)
}

/// Unix socket of shard `rank`: `<prefix>-<rank>`.
pub fn shard_socket(prefix: &Path, rank: usize) -> PathBuf {
    let mut path = prefix.as_os_str().to_os_string();
    path.push(format!("-{rank}"));
    PathBuf::from(path)
}

/// A client of the shard listening on the Unix socket `path`.
pub async fn connect_uds(
    path: &Path,
) -> Result<
    text_generation_service_client::TextGenerationServiceClient<Channel>,
    tonic::transport::Error,
> {
    let path: PathBuf = path.to_path_buf();
    // The URI is required by the API but unused: every connection goes to the socket.
    let channel = Endpoint::from_static("http://shard")
        .connect_with_connector(tower::service_fn(move |_| {
            let path = path.clone();
            async move {
                let stream = tokio::net::UnixStream::connect(path).await?;
                Ok::<_, std::io::Error>(hyper_util::rt::TokioIo::new(stream))
            }
        }))
        .await?;
    Ok(
        text_generation_service_client::TextGenerationServiceClient::new(channel)
            .max_decoding_message_size(256 << 20)
            .max_encoding_message_size(64 << 20),
    )
}
