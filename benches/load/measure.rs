//! One round against one target: probe it, warm it up, measure it at max rate and (for most
//! targets) at each fixed rate, and read the server's CPU time and context switches around each
//! phase. Each phase becomes a [`Row`]; the report folds the rounds' rows together.

use std::collections::BTreeMap;

use anyhow::{anyhow, bail};
use tokio::runtime::Runtime;

use crate::{
    load::{Budget, Connections, Stats, call_once, closed_loop, failure_note, open_loop},
    options::Options,
    processes::{cpu_seconds, switches_by_thread},
    targets::Target,
};

/// One round of one mode against one target; the table shows each (target, mode) over its
/// rounds.
pub struct Row {
    pub target: &'static str,
    pub mode: String,
    pub throughput: f64,
    pub stats: Stats,
    pub note: String,
    /// The server process's CPU time (user + system) per answered call, when it runs apart.
    pub server_cpu_us: Option<f64>,
    /// The state backend's (Redis's) CPU time per answered call, for the Redis row.
    pub state_cpu_us: Option<f64>,
    /// Fixed rate: how late the harness sent calls, p99.
    pub send_lag_ms: Option<f64>,
    /// The server process's context switches per answered call (voluntary, involuntary), at a
    /// fixed rate, when it runs apart.
    pub switches: Option<(f64, f64)>,
    /// Its voluntary context switches per answered call by thread name, at a fixed rate: which
    /// threads a call wakes (its thread hops), most first.
    pub wakeups: Vec<(String, f64)>,
}

/// What measuring one target gave.
pub struct Measured {
    pub ok: bool,
    /// Calls sent in all (probe, warm-up and both modes), to compare with spans received.
    pub calls: u64,
}

/// Probe, warm up, then max rate and (if the target has them) the fixed rates against one target:
/// one round.
pub fn measure(
    options: &Options,
    client_rt: &Runtime,
    target: &Target,
    rows: &mut Vec<Row>,
) -> anyhow::Result<Measured> {
    let connections = client_rt.block_on(Connections::open(target, options.connections))?;
    // A correct answer first on every connection: the numbers mean nothing if calls are refused.
    let probes = connections.callers(1);
    for mut caller in probes.iter().cloned() {
        let probe = client_rt
            .block_on(call_once(&mut caller, target))
            .map_err(|why| anyhow!("{}: the probe call failed: {why}", target.name))?;
        if probe != target.expected_output {
            bail!(
                "{}: the probe call returned {probe:?}, not the echoed text",
                target.name,
            );
        }
    }
    let warmup = client_rt.block_on(closed_loop(
        &connections,
        options.concurrency,
        target,
        Budget::For(options.warmup),
    ));
    let cpu_before = target.server_pid.and_then(cpu_seconds);
    let state_cpu_before = target.state_pid.and_then(cpu_seconds);
    let (max, elapsed) = client_rt.block_on(closed_loop(
        &connections,
        options.concurrency,
        target,
        Budget::For(options.duration),
    ));
    let server_cpu_us = cpu_before
        .zip(target.server_pid.and_then(cpu_seconds))
        .filter(|_| max.ok > 0)
        .map(|(before, after)| (after - before) * 1e6 / max.ok as f64);
    let state_cpu_us = state_cpu_before
        .zip(target.state_pid.and_then(cpu_seconds))
        .filter(|_| max.ok > 0)
        .map(|(before, after)| (after - before) * 1e6 / max.ok as f64);
    let calls = probes.len() as u64 + warmup.0.ok + warmup.0.failed + max.ok + max.failed;
    let ok = max.failed == 0 && warmup.0.failed == 0;
    rows.push(Row {
        target: target.name,
        mode: format!("max rate ({}×{})", options.connections, options.concurrency),
        throughput: max.ok as f64 / elapsed.as_secs_f64(),
        note: failure_note(&max),
        stats: max,
        server_cpu_us,
        state_cpu_us,
        send_lag_ms: None,
        switches: None,
        wakeups: Vec::new(),
    });
    if !target.fixed_rates {
        return Ok(Measured { ok, calls });
    }
    let mut calls = calls;
    let mut ok = ok;
    for &rate in &options.rates {
        let cpu_before = target.server_pid.and_then(cpu_seconds);
        let state_cpu_before = target.state_pid.and_then(cpu_seconds);
        let switches_before = target.server_pid.and_then(switches_by_thread);
        let fixed = open_loop(client_rt, &connections, target, rate, options.duration);
        let answered = fixed.stats.ok;
        let per_call = |total: f64| (answered > 0).then(|| total / answered as f64);
        let server_cpu_us = cpu_before
            .zip(target.server_pid.and_then(cpu_seconds))
            .and_then(|(before, after)| per_call((after - before) * 1e6));
        let state_cpu_us = state_cpu_before
            .zip(target.state_pid.and_then(cpu_seconds))
            .and_then(|(before, after)| per_call((after - before) * 1e6));
        let switches_after = target.server_pid.and_then(switches_by_thread);
        let total = |by: &BTreeMap<String, (u64, u64)>| {
            by.values()
                .fold((0u64, 0u64), |(v, i), (tv, ti)| (v + tv, i + ti))
        };
        let switches = switches_before
            .as_ref()
            .zip(switches_after.as_ref())
            .and_then(|(before, after)| {
                let ((v0, i0), (v1, i1)) = (total(before), total(after));
                Some((
                    per_call(v1.saturating_sub(v0) as f64)?,
                    per_call(i1.saturating_sub(i0) as f64)?,
                ))
            });
        let wakeups = switches_before
            .as_ref()
            .zip(switches_after.as_ref())
            .map(|(before, after)| wakeups_per_call(before, after, answered))
            .unwrap_or_default();
        calls += fixed.stats.ok + fixed.stats.failed;
        ok = ok && fixed.stats.failed == 0;
        let send_lag_ms = fixed.send_lag.value_at_quantile(0.99) as f64 / 1e6;
        let mut notes = Vec::new();
        if fixed.skipped > 0 {
            notes.push(format!("{} not sent (backlog)", fixed.skipped));
        }
        if fixed.stats.first_failure.is_some() {
            notes.push(failure_note(&fixed.stats));
        }
        notes.retain(|n| !n.is_empty());
        let note = notes.join("; ");
        rows.push(Row {
            target: target.name,
            mode: format!("{rate} rps"),
            throughput: fixed.stats.ok as f64 / fixed.elapsed.as_secs_f64(),
            stats: fixed.stats,
            note,
            server_cpu_us,
            state_cpu_us,
            send_lag_ms: Some(send_lag_ms),
            switches,
            wakeups,
        });
    }
    Ok(Measured { ok, calls })
}

/// Voluntary switches per call of each thread name with a noticeable share (≥ 0.01 per call),
/// most first.
fn wakeups_per_call(
    before: &BTreeMap<String, (u64, u64)>,
    after: &BTreeMap<String, (u64, u64)>,
    calls: u64,
) -> Vec<(String, f64)> {
    if calls == 0 {
        return Vec::new();
    }
    let mut per_call: Vec<(String, f64)> = after
        .iter()
        .map(|(name, (v, _))| {
            let was = before.get(name).map_or(0, |(v0, _)| *v0);
            (name.clone(), v.saturating_sub(was) as f64 / calls as f64)
        })
        .filter(|(_, n)| *n >= 0.01)
        .collect();
    per_call.sort_by(|a, b| b.1.total_cmp(&a.1));
    per_call
}
