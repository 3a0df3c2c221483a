use candle_core::Device;
use sonde_proto as pb;
use sonde_shard::engine::{Engine, EngineConfig};
use sonde_shard::loader::{self, LoadOptions};
use sonde_shard::model::QuantPolicy;
use std::time::Instant;

fn main() {
    let path = std::env::args().nth(1).unwrap();
    let policy = if std::env::args().nth(2).as_deref() == Some("keep") {
        QuantPolicy::Keep
    } else {
        QuantPolicy::RequantizeQ8_0
    };
    let t = Instant::now();
    let loaded = loader::load(
        path.as_ref(),
        &LoadOptions {
            device: Device::Cpu,
            quant_policy: policy,
        },
    )
    .unwrap();
    eprintln!("load {:?} {}", t.elapsed(), loaded.facts.dtype);
    let mut e = Engine::new(loaded, EngineConfig::default());
    for bs in [1usize, 1, 4, 16] {
        let reqs = (0..bs)
            .map(|i| pb::Request {
                id: i as u64,
                input_ids: (0..128).map(|j| (j * 7 + i) as u32 % 49152).collect(),
                stopping: Some(pb::StoppingParameters {
                    max_new_tokens: 17,
                    ignore_eos_token: true,
                    ..Default::default()
                }),
                ..Default::default()
            })
            .collect();
        let t = Instant::now();
        let mut b = e
            .prefill(pb::Batch {
                id: 7,
                requests: reqs,
            })
            .unwrap()
            .batch;
        let tp = t.elapsed();
        let t = Instant::now();
        let mut steps = 0;
        while let Some(x) = b {
            b = e.decode(&[x.id]).unwrap().batch;
            steps += 1;
        }
        let td = t.elapsed();
        eprintln!(
            "bs {bs}: prefill {:.0} tok/s, decode {:.1} tok/s ({steps} steps)",
            (bs * 128) as f64 / tp.as_secs_f64(),
            (bs * steps) as f64 / td.as_secs_f64()
        );
    }
}
