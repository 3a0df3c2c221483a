//! TGI's API: `/generate`, `/generate_stream` and the `/` compat route.

pub mod convert;
mod handlers;
pub mod respond;
pub mod types;

pub use handlers::{
    __path_compat, __path_generate, __path_generate_stream, compat, generate, generate_stream,
};
