//! The option types the launcher, router and shard share, each defined once: a flag's
//! value on every command line that takes it, and what the code matches on.
//! `LogprobsMode` is the proto's own enum (its derives are added in `build.rs`).

use clap::ValueEnum;

/// Where the model runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Device {
    Cpu,
    /// The first CUDA GPU (needs a build with `--features cuda`).
    Cuda,
}

/// What to do with GGUF block formats at load.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, ValueEnum)]
pub enum WeightQuant {
    /// Serve the blocks as stored: Sonde's CPU kernels multiply every supported block
    /// format by f32 activations, so scores are those of the file's weights.
    #[default]
    #[value(name = "auto", alias = "keep")]
    Keep,
    /// Re-quantize Q4_0/Q4_1/Q5_0/Q5_1 matrices to Q8_0 at load (for devices whose
    /// kernels favour it). An 8-bit grid per 32 values is finer than a 4-bit one, but the
    /// weights change.
    #[value(name = "q8_0")]
    Q8_0,
}

/// A value as its flag spells it, from clap's own names, so a command line one process
/// builds is what the other parses.
pub trait FlagValue: ValueEnum {
    fn flag_value(&self) -> String {
        self.to_possible_value()
            .map(|v| v.get_name().to_string())
            .unwrap_or_default()
    }
}

impl<T: ValueEnum> FlagValue for T {}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::LogprobsMode;

    fn round_trips<T: ValueEnum + PartialEq + std::fmt::Debug>() {
        for v in T::value_variants() {
            assert_eq!(T::from_str(&v.flag_value(), false).as_ref(), Ok(v));
        }
    }

    #[test]
    fn every_value_parses_back_from_its_flag_value() {
        round_trips::<Device>();
        round_trips::<WeightQuant>();
        round_trips::<LogprobsMode>();
    }

    #[test]
    fn the_names_users_and_the_wire_see() {
        assert_eq!(LogprobsMode::Processed.flag_value(), "processed");
        assert_eq!(WeightQuant::Keep.flag_value(), "auto");
        assert_eq!(WeightQuant::from_str("keep", false), Ok(WeightQuant::Keep));
        assert_eq!(WeightQuant::Q8_0.flag_value(), "q8_0");
        assert_eq!(Device::Cuda.flag_value(), "cuda");
        // TGI's `logprobs_mode` field and the proto share the type.
        let parsed: LogprobsMode = serde_json::from_str("\"raw\"").unwrap();
        assert_eq!(parsed, LogprobsMode::Raw);
        assert_eq!(LogprobsMode::Raw as i32, 0);
    }
}
