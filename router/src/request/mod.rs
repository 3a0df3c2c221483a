//! The request as Sonde sees it, whatever API it came through.
//!
//! TGI, OpenAI and Vertex each own their wire types and convert them into a
//! `GenerationSpec`; `validation` checks the spec and reports a `Violation` naming a
//! `Field`; the API words it with its own `FieldNames`. A new API (`/v1/score`) is one
//! more conversion and one more set of names.

mod spec;
mod violation;

pub use spec::{GenerationSpec, Prompt, SamplingSpec, ScoreSpec};
pub use violation::{Field, FieldNames, SpecError, Violation};
