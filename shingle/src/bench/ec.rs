//! `shingle bench ec`: erasure-coding throughput of `shingle_data::ec` against calling
//! reed-solomon-simd directly on the same shards, measured in one run (alternating
//! within each round) so the ratios are meaningful on a noisy machine.
//!
//! Rates are data bytes per second (`k * unit` per stripe), on one thread. The
//! baselines reuse one encoder or decoder, feed it the same shards and read its output
//! in place; ours also produces owned `Bytes` (parity shards, or the whole stripe).
//! `encode_stripe` takes `&[u8]` and must copy the stripe to return owned data
//! shards, so it cannot reach the codec's rate; it is shown for comparison with the
//! zero-copy `encode_stripe_bytes`, the one the write path uses.

use super::transport::machine;
use anyhow::{Context, Result};
use bytes::Bytes;
use serde::Serialize;
use shingle_data::ec::EcPolicy;
use shingle_data::ec::codec::{ReedSolomonDecoder, ReedSolomonEncoder};
use std::hint::black_box;
use std::time::{Duration, Instant};

/// Options of the erasure-coding benchmark.
#[derive(Debug, Clone, clap::Args)]
pub struct EcBenchArgs {
    /// Data shards per stripe.
    #[arg(long, default_value_t = 4)]
    pub k: u8,
    /// Parity shards per stripe.
    #[arg(long, default_value_t = 2)]
    pub m: u8,
    /// Stripe unit (bytes of one data shard) in KiB.
    #[arg(long, default_value_t = 1024)]
    pub unit_kib: u32,
    /// Seconds per measurement.
    #[arg(long, default_value_t = 2.0)]
    pub seconds: f64,
    /// Measurement rounds; ours and the baseline alternate within a round and the
    /// median of the per-round ratios is reported.
    #[arg(long, default_value_t = 3)]
    pub rounds: usize,
    /// Write the results as JSON to this file.
    #[arg(long)]
    pub json: Option<std::path::PathBuf>,
}

#[derive(Debug, Serialize)]
struct Row {
    op: String,
    ours_gb_s: f64,
    codec_gb_s: f64,
    ratio: f64,
}

#[derive(Debug, Serialize)]
struct Report {
    machine: String,
    policy: String,
    unit_kib: u32,
    seconds_per_point: f64,
    rounds: usize,
    rows: Vec<Row>,
}

/// Runs the benchmark (on a blocking thread) and prints a table.
pub async fn run(args: EcBenchArgs) -> Result<()> {
    tokio::task::spawn_blocking(move || run_blocking(args))
        .await
        .context("join benchmark thread")?
}

fn run_blocking(args: EcBenchArgs) -> Result<()> {
    let unit = args.unit_kib.checked_mul(1024).context("unit too large")?;
    let policy = EcPolicy::new(args.k, args.m, unit).context("build policy")?;
    let (k, m, unit) = (usize::from(policy.k), usize::from(policy.m), unit as usize);
    let stripe: Bytes = (0..k * unit)
        .map(|i| (i * 7 + i / 4093) as u8)
        .collect::<Vec<u8>>()
        .into();
    let shards = policy.encode_stripe_bytes(stripe.clone()).context("encode stripe")?;
    let lost = 2.min(k).min(m);
    let partial: Vec<Option<Bytes>> = shards
        .iter()
        .enumerate()
        .map(|(i, s)| (i >= lost).then(|| s.clone()))
        .collect();
    anyhow::ensure!(
        policy.decode_stripe(stripe.len(), &partial)? == stripe,
        "decode mismatch"
    );
    let mut encoder = ReedSolomonEncoder::new(k, m, unit).context("create encoder")?;
    let mut decoder = ReedSolomonDecoder::new(k, m, unit).context("create decoder")?;
    let data_shards = &shards[..k];
    let parity_shards = &shards[k..];

    println!("{}", machine());
    println!(
        "{policy} unit {} KiB, one thread: data GB/s (median of {} rounds of {}s each, alternating with the codec alone)",
        args.unit_kib, args.rounds, args.seconds
    );
    println!(
        "{:>22} {:>10} {:>10} {:>7}",
        "operation", "ours GB/s", "codec GB/s", "ratio"
    );
    let bytes = stripe.len();
    let rows = vec![
        measure(
            &args,
            "encode_stripe_bytes".into(),
            bytes,
            &mut || {
                black_box(policy.encode_stripe_bytes(stripe.clone())?);
                Ok(())
            },
            &mut || codec_encode(&mut encoder, data_shards),
        )?,
        measure(
            &args,
            "encode_stripe (&[u8])".into(),
            bytes,
            &mut || {
                black_box(policy.encode_stripe(&stripe)?);
                Ok(())
            },
            &mut || codec_encode(&mut encoder, data_shards),
        )?,
        measure(
            &args,
            format!("decode_stripe, {lost} lost"),
            bytes,
            &mut || {
                black_box(policy.decode_stripe(bytes, &partial)?);
                Ok(())
            },
            &mut || codec_decode(&mut decoder, data_shards, parity_shards, lost),
        )?,
    ];

    let report = Report {
        machine: machine(),
        policy: policy.to_string(),
        unit_kib: args.unit_kib,
        seconds_per_point: args.seconds,
        rounds: args.rounds,
        rows,
    };
    if let Some(path) = args.json {
        std::fs::write(&path, serde_json::to_vec_pretty(&report)?)
            .with_context(|| format!("write {}", path.display()))?;
        println!("\nwrote {}", path.display());
    }
    Ok(())
}

/// Measures `ours` against `codec` for `args.rounds` rounds and prints the row.
fn measure(
    args: &EcBenchArgs,
    op: String,
    bytes: usize,
    ours: &mut dyn FnMut() -> Result<()>,
    codec: &mut dyn FnMut() -> Result<()>,
) -> Result<Row> {
    let dur = Duration::try_from_secs_f64(args.seconds).context("--seconds must be a non-negative number")?;
    let (mut o, mut c, mut ratios) = (Vec::new(), Vec::new(), Vec::new());
    for round in 0..args.rounds.max(1) {
        // Alternate which side goes first, so neither always runs on the warmer cache.
        let (ro, rc) = if round % 2 == 0 {
            let ro = rate(ours, bytes, dur)?;
            (ro, rate(codec, bytes, dur)?)
        } else {
            let rc = rate(codec, bytes, dur)?;
            (rate(ours, bytes, dur)?, rc)
        };
        o.push(ro);
        c.push(rc);
        ratios.push(ro / rc);
    }
    let row = Row {
        op,
        ours_gb_s: super::median(&mut o) / 1e9,
        codec_gb_s: super::median(&mut c) / 1e9,
        ratio: super::median(&mut ratios),
    };
    println!(
        "{:>22} {:>10.2} {:>10.2} {:>7.2}",
        row.op, row.ours_gb_s, row.codec_gb_s, row.ratio
    );
    Ok(row)
}

/// Bytes per second of `op`, which processes `bytes` per call, run for `dur` after one
/// warm-up call.
fn rate(op: &mut dyn FnMut() -> Result<()>, bytes: usize, dur: Duration) -> Result<f64> {
    op()?;
    let t = Instant::now();
    let mut calls = 0u64;
    while t.elapsed() < dur {
        op()?;
        calls += 1;
    }
    Ok(calls as f64 * bytes as f64 / t.elapsed().as_secs_f64())
}

/// The baseline encode: the data shards into a reused encoder, parity read in place.
fn codec_encode(encoder: &mut ReedSolomonEncoder, data: &[Bytes]) -> Result<()> {
    for shard in data {
        encoder.add_original_shard(shard)?;
    }
    let result = encoder.encode()?;
    for parity in result.recovery_iter() {
        black_box(parity);
    }
    Ok(())
}

/// The baseline decode: the first `lost` data shards missing, the minimum number of
/// parity shards added, restored shards read in place.
fn codec_decode(decoder: &mut ReedSolomonDecoder, data: &[Bytes], parity: &[Bytes], lost: usize) -> Result<()> {
    for (i, shard) in data.iter().enumerate().skip(lost) {
        decoder.add_original_shard(i, shard)?;
    }
    for (j, shard) in parity.iter().enumerate().take(lost) {
        decoder.add_recovery_shard(j, shard)?;
    }
    let result = decoder.decode()?;
    for restored in result.restored_original_iter() {
        black_box(restored);
    }
    Ok(())
}
