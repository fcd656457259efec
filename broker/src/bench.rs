//! `cloister bench`'s report: the same workloads measured directly and through the cage, joined
//! by name, with the ratio of caged to direct median time per operation (> 1: the cage costs
//! that much).
//!
//! The JSON document (`--json`) is
//! `{ "load": N, "direct": RUN, "caged": RUN, "ratios": { NAME: caged/direct median time },
//! "targets": { NAME: { "kind": "ratio" | "added_us", "limit", "value", "met" } } }`, where a RUN
//! is what `cloister-bench-client` printed: `device`, `platform`, `host_unified`, `quick`, and
//! `results`, one per workload: `name`, `ops_per_repeat`, `repeats`, `min_ns`, `median_ns`,
//! `max_ns` (time per operation), and where it applies `bytes_per_op`, `throughput` and
//! `throughput_unit` (at the median time).
//!
//! The targets are issue 12's (`Target::of`): a workload's caged median time at most so many
//! times the direct one (`ratio`), or at most so many microseconds more (`added_us`, the
//! enqueue + `clFinish` round trip). The table shows each beside its ratio and ends with how many
//! are met and which are not: a run on a shared machine may miss one by its noise, so a miss is
//! a figure to look at again, not a verdict on one run.
//!
//! With `--pairs N` the whole is measured in N pairs of fresh processes (`merge_pairs`); a
//! row's ratio is then the median of the pairs' own ratios (`Row::ratio`).
//!
//! The two clients run side by side and take turns (`interleave`): each workload is measured in
//! `--rounds` blocks, a block of the direct client, then one of the caged, and so on, so both
//! are measured in the same stretch of time. On a shared machine whose speed drifts from one
//! second to the next (the H100 host's small calls change speed by 1.5-2x within one process),
//! one run after the other measured the drift as much as the cage.

use serde_json::Value;
use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};

use crate::lockstep;

/// What a client under `--lockstep` says next.
#[derive(Debug)]
enum Said {
    /// Ready for the next block of this workload.
    Wait(String),
    /// Done: its whole run.
    Result(Value),
}

/// A benchmark client running under `--lockstep`, killed and reaped if dropped before its end.
struct Client {
    role: &'static str,
    child: Child,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
    /// Its standard error, read to the end by a thread of its own (a client that writes much
    /// there cannot stall on a full pipe).
    stderr: Option<std::thread::JoinHandle<String>>,
}

impl Client {
    fn start(role: &'static str, mut cmd: Command) -> Result<Self, String> {
        cmd.arg("--lockstep").stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(Stdio::piped());
        let mut child = cmd.spawn().map_err(|e| format!("cannot run the {role} benchmark client: {e}"))?;
        let (Some(stdin), Some(stdout), Some(mut err)) = (child.stdin.take(), child.stdout.take(), child.stderr.take())
        else {
            let _ = child.kill();
            let _ = child.wait();
            return Err(format!("the {role} benchmark client has no pipes"));
        };
        let stderr = std::thread::spawn(move || {
            let mut text = String::new();
            let _ = std::io::Read::read_to_string(&mut err, &mut text);
            text
        });
        Ok(Client { role, child, stdin, stdout: BufReader::new(stdout), stderr: Some(stderr) })
    }

    /// Its next line of the protocol (`lockstep`); other lines on its standard output are not
    /// ours and skipped.
    fn next(&mut self) -> Result<Said, String> {
        let mut line = String::new();
        loop {
            line.clear();
            match self.stdout.read_line(&mut line) {
                Ok(0) | Err(_) => return Err(self.failure()),
                Ok(_) => {}
            }
            match lockstep::parse(&line) {
                Some(lockstep::Line::Wait(name)) => return Ok(Said::Wait(name.to_string())),
                Some(lockstep::Line::Result(doc)) => {
                    return serde_json::from_str(doc)
                        .map(Said::Result)
                        .map_err(|e| format!("the {} benchmark client printed bad JSON: {e}", self.role))
                }
                None => {}
            }
        }
    }

    /// Lets it run its next block.
    fn go(&mut self) -> Result<(), String> {
        self.stdin.write_all(b"go\n").and_then(|()| self.stdin.flush()).map_err(|_| self.failure())
    }

    /// Why it stopped talking: its exit and what it wrote on standard error.
    fn failure(&mut self) -> String {
        let _ = self.child.kill();
        let status = self.child.wait().map(|s| s.to_string()).unwrap_or_else(|e| e.to_string());
        let said = self.stderr.take().and_then(|t| t.join().ok()).unwrap_or_default();
        format!("benchmark client ({}) failed ({status}): {}", self.role, said.trim())
    }

    /// Waits for its exit after its result.
    fn finish(mut self) -> Result<(), String> {
        match self.child.wait() {
            Ok(s) if s.success() => Ok(()),
            _ => Err(self.failure()),
        }
    }
}

impl Drop for Client {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// Runs the direct and the caged client (`cloister-bench-client` commands, without
/// `--lockstep`, which this adds) block by block in turns: the direct one's block, then the
/// caged one's, while the other waits. The caged client starts once the direct one has set up,
/// so neither's start overlaps the other's measuring. Both must run the same workloads in the
/// same order (the same flags). Returns both runs' documents.
pub fn interleave(direct: Command, caged: Command) -> Result<(Value, Value), String> {
    let mut d = Client::start("direct", direct)?;
    let mut d_said = d.next()?;
    let mut c = Client::start("caged", caged)?;
    let mut c_said = c.next()?;
    loop {
        match (d_said, c_said) {
            (Said::Wait(a), Said::Wait(b)) if a == b => {
                d.go()?;
                d_said = d.next()?;
                c.go()?;
                c_said = c.next()?;
            }
            (Said::Result(a), Said::Result(b)) => {
                d.finish()?;
                c.finish()?;
                return Ok((a, b));
            }
            (a, b) => {
                return Err(format!("the direct and the caged benchmark clients went out of step: {a:?} against {b:?}"))
            }
        }
    }
}

/// The median of `xs` (the mean of the middle two for an even count); `None` if empty.
fn median(mut xs: Vec<f64>) -> Option<f64> {
    xs.sort_by(f64::total_cmp);
    let n = xs.len();
    match n {
        0 => None,
        _ if n % 2 == 1 => Some(xs[n / 2]),
        _ => Some((xs[n / 2 - 1] + xs[n / 2]) / 2.0),
    }
}

/// One client role's runs from `--pairs` fresh processes, as one run: per workload the median
/// of the processes' medians, the lowest minimum and the highest maximum, the repeats summed,
/// the throughput at the new median, and each process's median kept as `pair_median_ns`. A
/// driver's pace differs from one process to the next (on the H200 a 4 KiB non-blocking write
/// took 3.0-4.3 us directly in successive processes), so one process against one other
/// measured which two processes were drawn as much as the cage. A workload some run lacks
/// is joined from those that have it (the further draws of the short rows run those alone:
/// `short_rows`). The document is the first run's otherwise, its `pairs` the runs' count.
pub fn merge_pairs(runs: &[Value]) -> Value {
    let Some(first) = runs.first() else { return Value::Null };
    let mut doc = first.clone();
    doc["pairs"] = runs.len().into();
    let Some(results) = doc["results"].as_array_mut() else { return doc };
    for r in results.iter_mut() {
        let Some(name) = r["name"].as_str().map(str::to_string) else { continue };
        let same: Vec<&Value> = runs
            .iter()
            .filter_map(|run| run["results"].as_array()?.iter().find(|x| x["name"].as_str() == Some(&name)))
            .collect();
        let field = |key: &str| -> Vec<f64> { same.iter().filter_map(|x| x[key].as_f64()).collect() };
        let medians = field("median_ns");
        let Some(merged) = median(medians.clone()) else { continue };
        if let Some(t) = r["throughput"].as_f64() {
            // Throughput is per time: at the merged median, whatever its unit.
            let own = r["median_ns"].as_f64().unwrap_or(merged);
            r["throughput"] = (t * own / merged).into();
        }
        r["median_ns"] = merged.into();
        if let Some(min) = field("min_ns").into_iter().reduce(f64::min) {
            r["min_ns"] = min.into();
        }
        if let Some(max) = field("max_ns").into_iter().reduce(f64::max) {
            r["max_ns"] = max.into();
        }
        r["repeats"] = same.iter().filter_map(|x| x["repeats"].as_u64()).sum::<u64>().into();
        r["pair_median_ns"] = medians.into();
    }
    doc
}

/// Rows whose operation took less than this (median, directly and caged) are measured in
/// `--draws` pairs of processes (`short_rows`).
pub const SHORT_ROW_NS: f64 = 100_000.0;

/// The rows `cloister bench` measures again in further pairs of fresh processes, those rows
/// alone, until each has `--draws` pairs: those whose operation took under `SHORT_ROW_NS` in
/// both merged runs, save `platform_init` (one sample a process, and the process's start is
/// what it measures). A short operation's time is the driver's pace in that process, which the
/// driver draws at its start (on the H200 a 4 KiB non-blocking write took 2.9-3.3 us in some
/// processes and 3.9-4.4 in others, directly and in a worker alike): in a few pairs, its ratio
/// compared the draws as much as the cage. A further pair of such rows costs a process start
/// and well under a second a row.
pub fn short_rows(direct: &Value, caged: &Value) -> Vec<String> {
    rows(direct, caged)
        .iter()
        .filter(|r| r.name != "platform_init")
        .filter(|r| [r.direct, r.caged].iter().all(|x| x["median_ns"].as_f64().is_some_and(|m| m < SHORT_ROW_NS)))
        .map(|r| r.name.to_string())
        .collect()
}

/// `median (min-max)`, all in the median's unit.
fn spread(r: &Value) -> Option<String> {
    let (min, median, max) = (r["min_ns"].as_f64()?, r["median_ns"].as_f64()?, r["max_ns"].as_f64()?);
    let (div, unit, digits) = match median {
        m if m >= 1e6 => (1e6, "ms", 2),
        m if m >= 1e3 => (1e3, "us", 1),
        _ => (1.0, "ns", 0),
    };
    Some(format!("{:.*} {unit} ({:.*}-{:.*})", digits, median / div, digits, min / div, digits, max / div))
}

/// What issue 12 asks of a workload: the caged median time against the direct one, in the same
/// run. Workloads without one (start-up, buffer creation, the 64 MiB kernel) have none.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Target {
    /// At most this many times the direct time.
    Ratio(f64),
    /// At most this many microseconds more than the direct time.
    AddedMicros(f64),
}

impl Target {
    /// The target for workload `name` with `load` busy processes beside the runs, on a device
    /// whose memory is the host's (`host_unified`) or not.
    fn of(name: &str, load: usize, host_unified: bool) -> Option<Target> {
        let transfer = ["write_", "read_"].iter().any(|op| {
            name.strip_prefix(op).is_some_and(|rest| ["4k", "1m", "64m"].contains(&rest.trim_end_matches("_nb")))
        });
        match name {
            "info_query" | "set_kernel_arg" => Some(Target::Ratio(2.0)),
            // At least 0.8 of the direct throughput; under load, at least half.
            _ if name.starts_with("enqueue_stream_") => Some(Target::Ratio(if load == 0 { 1.25 } else { 2.0 })),
            "enqueue_finish_roundtrip" => Some(Target::AddedMicros(3.0)),
            // At least 0.9 of the direct throughput.
            _ if transfer => Some(Target::Ratio(1.0 / 0.9)),
            "map_read_64m" | "map_write_64m" => Some(Target::Ratio(if host_unified { 1.5 } else { 2.0 })),
            _ => None,
        }
    }

    /// Where `row` stands against it: the figure compared and whether it is within the target.
    fn judge(self, row: &Row) -> Option<(f64, bool)> {
        match self {
            Target::Ratio(limit) => row.ratio().map(|r| (r, r <= limit)),
            Target::AddedMicros(limit) => row.added_micros().map(|a| (a, a <= limit)),
        }
    }

    /// `<= 1.11`, `+3 us`.
    fn describe(self) -> String {
        match self {
            Target::Ratio(limit) => format!("<= {limit:.2}"),
            Target::AddedMicros(limit) => format!("+{limit} us"),
        }
    }

    /// The figure as the target speaks of it: `1.04`, `+2.1 us`.
    fn figure(self, value: f64) -> String {
        match self {
            Target::Ratio(_) => format!("{value:.2}"),
            Target::AddedMicros(_) => format!("{value:+.1} us"),
        }
    }
}

/// One workload in both runs.
struct Row<'a> {
    name: &'a str,
    direct: &'a Value,
    caged: &'a Value,
}

impl Row<'_> {
    /// Caged over direct median time; of several pairs of processes, the median of each pair's
    /// own ratio (`pair_ratios`): a pair's two clients took turns in the same stretch of time,
    /// so its ratio is free of the machine's drift from one pair to the next, which a ratio of
    /// the joined medians (each perhaps from another pair) is not.
    fn ratio(&self) -> Option<f64> {
        match self.pair_ratios() {
            pairs if !pairs.is_empty() => median(pairs),
            _ => Some(self.caged["median_ns"].as_f64()? / self.direct["median_ns"].as_f64()?),
        }
    }

    /// The caged median time less the direct one, in microseconds; of several pairs, the
    /// median of each pair's own (as `ratio`).
    fn added_micros(&self) -> Option<f64> {
        let added_ns = match self.pair_medians() {
            Some((d, c)) => median(d.iter().zip(&c).map(|(d, c)| c - d).collect())?,
            None => self.caged["median_ns"].as_f64()? - self.direct["median_ns"].as_f64()?,
        };
        Some(added_ns / 1e3)
    }

    /// Each pair of processes' own ratio (`merge_pairs`), in the order they ran; empty for a
    /// run of one pair.
    fn pair_ratios(&self) -> Vec<f64> {
        self.pair_medians().map(|(d, c)| d.iter().zip(&c).map(|(d, c)| c / d).collect()).unwrap_or_default()
    }

    /// The direct and the caged medians of each pair (`merge_pairs`), if there were two pairs
    /// or more.
    fn pair_medians(&self) -> Option<(Vec<f64>, Vec<f64>)> {
        let of = |run: &Value| -> Vec<f64> {
            run["pair_median_ns"].as_array().map(|a| a.iter().filter_map(Value::as_f64).collect()).unwrap_or_default()
        };
        let (d, c) = (of(self.direct), of(self.caged));
        (d.len() >= 2 && d.len() == c.len()).then_some((d, c))
    }
}

fn rows<'a>(direct: &'a Value, caged: &'a Value) -> Vec<Row<'a>> {
    let (Some(direct_results), Some(caged_results)) = (direct["results"].as_array(), caged["results"].as_array())
    else {
        return Vec::new();
    };
    direct_results
        .iter()
        .filter_map(|d| {
            let name = d["name"].as_str()?;
            let c = caged_results.iter().find(|c| c["name"].as_str() == Some(name))?;
            Some(Row { name, direct: d, caged: c })
        })
        .collect()
}

/// Where a row stands against its target.
#[derive(Clone, Copy)]
struct Verdict {
    target: Target,
    /// The figure compared: the ratio, or the added microseconds.
    value: f64,
    met: bool,
}

impl Verdict {
    /// The row's target and where it stands (`Target::judge`), if it has one.
    fn of(row: &Row, load: usize, host_unified: bool) -> Option<Verdict> {
        let target = Target::of(row.name, load, host_unified)?;
        let (value, met) = target.judge(row)?;
        Some(Verdict { target, value, met })
    }

    /// The table's `target` column: `<= 1.11 met`, `+3 us: +2.5 us OVER` (a ratio is in its
    /// own column already; an added time is not).
    fn column(&self) -> String {
        let figure = match self.target {
            Target::Ratio(_) => String::new(),
            Target::AddedMicros(_) => format!(": {}", self.target.figure(self.value)),
        };
        format!("{}{figure} {}", self.target.describe(), if self.met { "met" } else { "OVER" })
    }
}

/// The report: a table, or with `json` a document holding both runs, the ratios, the targets
/// and the load.
pub fn render(direct: &Value, caged: &Value, load: usize, json: bool) -> String {
    let rows = rows(direct, caged);
    let rounds = direct["rounds"].as_u64().unwrap_or(1);
    let pairs = direct["pairs"].as_u64().unwrap_or(1);
    let draws = direct["draws"].as_u64().unwrap_or(pairs);
    let host_unified = direct["host_unified"].as_bool() == Some(true);
    // Beside `rows`, one for each.
    let verdicts: Vec<Option<Verdict>> = rows.iter().map(|r| Verdict::of(r, load, host_unified)).collect();
    let judged = || rows.iter().zip(&verdicts).filter_map(|(r, v)| Some((r, (*v)?)));
    if json {
        let ratios: serde_json::Map<String, Value> =
            rows.iter().filter_map(|r| Some((r.name.to_string(), Value::from(r.ratio()?)))).collect();
        let targets: serde_json::Map<String, Value> = judged()
            .map(|(r, v)| {
                let (kind, limit) = match v.target {
                    Target::Ratio(l) => ("ratio", l),
                    Target::AddedMicros(l) => ("added_us", l),
                };
                (
                    r.name.to_string(),
                    serde_json::json!({ "kind": kind, "limit": limit, "value": v.value, "met": v.met }),
                )
            })
            .collect();
        let pair_ratios: serde_json::Map<String, Value> = rows
            .iter()
            .map(|r| (r.name.to_string(), r.pair_ratios()))
            .filter(|(_, p)| !p.is_empty())
            .map(|(name, p)| (name, Value::from(p)))
            .collect();
        let doc = serde_json::json!({
            "load": load, "direct": direct, "caged": caged, "ratios": ratios, "pair_ratios": pair_ratios,
            "targets": targets
        });
        return format!("{}\n", serde_json::to_string_pretty(&doc).unwrap_or_default());
    }
    let mut out = format!(
        "cloister bench: {} on {}{}, {load} busy process{} beside each run\n\
         time per operation: median (min-max) over the repeats, taken in {rounds} block{} per \
         workload, direct and caged in turns{}; ratio = caged / direct median (1.00 = no cost; \
         lower is better); target = the most the cage may cost there (README, \"Benchmarks\")\n\n",
        direct["device"].as_str().unwrap_or("?"),
        direct["platform"].as_str().unwrap_or("?"),
        if direct["quick"].as_bool() == Some(true) { " (quick)" } else { "" },
        if load == 1 { "" } else { "es" },
        if rounds == 1 { "" } else { "s" },
        match (pairs, draws) {
            (1, 1) => String::new(),
            _ => format!(
                ", in {pairs} pair{} of fresh processes one after the other{} (median: the pairs' \
                 medians'; pairs: each pair's own ratio; ratio and target: the median of the \
                 pairs' own)",
                if pairs == 1 { "" } else { "s" },
                if draws > pairs {
                    format!(", the rows of operations under {} us in {draws}", SHORT_ROW_NS / 1e3)
                } else {
                    String::new()
                }
            ),
        },
    );
    let header = format!(
        "{:<26} {:>27} {:>27} {:>8}  {:<18} {:<32} {}",
        "workload",
        "direct",
        "caged",
        "ratio",
        "target",
        "throughput direct / caged",
        if draws > 1 { "pairs" } else { "" }
    );
    out.push_str(header.trim_end());
    out.push('\n');
    for (r, verdict) in rows.iter().zip(&verdicts) {
        let throughput = match (r.direct["throughput"].as_f64(), r.caged["throughput"].as_f64()) {
            (Some(d), Some(c)) => format!("{d:.2} / {c:.2} {}", r.direct["throughput_unit"].as_str().unwrap_or("")),
            _ => String::new(),
        };
        let pair_ratios: Vec<String> = r.pair_ratios().iter().map(|x| format!("{x:.2}")).collect();
        let line = format!(
            "{:<26} {:>27} {:>27} {:>8}  {:<18} {:<32} {}",
            r.name,
            spread(r.direct).unwrap_or_default(),
            spread(r.caged).unwrap_or_default(),
            r.ratio().map(|x| format!("{x:.2}")).unwrap_or_default(),
            verdict.map(|v| v.column()).unwrap_or_default(),
            throughput,
            pair_ratios.join(" ")
        );
        out.push_str(line.trim_end());
        out.push('\n');
    }
    let judged_count = judged().count();
    if judged_count > 0 {
        let over: Vec<String> = judged()
            .filter(|(_, v)| !v.met)
            .map(|(r, v)| format!("{} {} ({})", r.name, v.target.figure(v.value), v.target.describe()))
            .collect();
        let met = judged_count - over.len();
        out.push_str(&format!("\ntargets: {met} of {judged_count} met"));
        if !over.is_empty() {
            out.push_str(&format!("; over: {}", over.join(", ")));
        }
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A run with workload `w` at `median_ns` (min 10% lower, max 10% higher), and `n`.
    fn run(median_ns: f64, bytes: Option<u64>) -> Value {
        let mut r = serde_json::json!({
            "name": "w", "min_ns": median_ns * 0.9, "median_ns": median_ns, "max_ns": median_ns * 1.1
        });
        if let Some(b) = bytes {
            r["bytes_per_op"] = b.into();
            r["throughput"] = (b as f64 / median_ns).into();
            r["throughput_unit"] = "GB/s".into();
        }
        let n = serde_json::json!({ "name": "n", "min_ns": 40.0, "median_ns": 50.0, "max_ns": 70.0 });
        serde_json::json!({ "device": "d", "platform": "p", "results": [r, n] })
    }

    #[test]
    fn ratio_is_caged_over_direct_median_time_and_json_keeps_both_runs_and_load() {
        let json: Value = serde_json::from_str(&render(&run(10.0, None), &run(25.0, None), 3, true)).unwrap();
        assert_eq!(json["ratios"]["w"].as_f64(), Some(2.5));
        assert_eq!(json["ratios"]["n"].as_f64(), Some(1.0));
        assert_eq!(json["load"].as_u64(), Some(3));
        assert_eq!(json["caged"]["results"][0]["median_ns"].as_f64(), Some(25.0));
        assert_eq!(json["direct"]["results"][1]["min_ns"].as_f64(), Some(40.0));
    }

    /// Runs of the named workloads at the given median times, on a host-unified device or not.
    fn runs(workloads: &[(&str, f64, f64)], host_unified: bool) -> (Value, Value) {
        let run = |pick: fn(&(&str, f64, f64)) -> f64| {
            let results: Vec<Value> = workloads
                .iter()
                .map(|w| serde_json::json!({ "name": w.0, "min_ns": pick(w), "median_ns": pick(w), "max_ns": pick(w) }))
                .collect();
            serde_json::json!({ "device": "d", "platform": "p", "host_unified": host_unified, "results": results })
        };
        (run(|w| w.1), run(|w| w.2))
    }

    #[test]
    fn each_target_of_issue_12_is_where_it_belongs() {
        assert_eq!(Target::of("set_kernel_arg", 0, false), Some(Target::Ratio(2.0)));
        assert_eq!(Target::of("info_query", 4, true), Some(Target::Ratio(2.0)));
        assert_eq!(Target::of("enqueue_stream_20000", 0, false), Some(Target::Ratio(1.25)));
        assert_eq!(Target::of("enqueue_stream_2000", 2, false), Some(Target::Ratio(2.0)));
        assert_eq!(Target::of("enqueue_finish_roundtrip", 0, true), Some(Target::AddedMicros(3.0)));
        for name in ["write_4k", "read_4k_nb", "write_1m_nb", "read_1m", "write_64m", "read_64m_nb"] {
            assert_eq!(Target::of(name, 0, false), Some(Target::Ratio(1.0 / 0.9)), "{name}");
        }
        assert_eq!(Target::of("map_read_64m", 0, true), Some(Target::Ratio(1.5)));
        assert_eq!(Target::of("map_write_64m", 0, false), Some(Target::Ratio(2.0)));
        for name in ["platform_init", "create_release_4k", "create_release_64k_data", "kernel_finish_64m", "write_2k"] {
            assert_eq!(Target::of(name, 0, false), None, "{name}");
        }
    }

    #[test]
    fn targets_are_judged_shown_and_summed_up() {
        let workloads = [
            ("set_kernel_arg", 10.0, 20.0),             // exactly at 2: met
            ("write_4k_nb", 1000.0, 1120.0),            // 1.12 > 1.11: over
            ("enqueue_finish_roundtrip", 10e3, 12.5e3), // +2.5 us: met
            ("map_read_64m", 1e6, 1.8e6),               // 1.8: over on pocl, met on a GPU
            ("create_release_4k", 100.0, 900.0),        // no target
        ];
        let (d, c) = runs(&workloads, true);
        let table = render(&d, &c, 0, false);
        let line = |name: &str| table.lines().find(|l| l.starts_with(&format!("{name} "))).unwrap().to_string();
        assert!(line("set_kernel_arg").contains("<= 2.00 met"), "{table}");
        assert!(line("write_4k_nb").contains("<= 1.11 OVER"), "{table}");
        assert!(line("enqueue_finish_roundtrip").contains("+3 us: +2.5 us met"), "{table}");
        assert!(line("map_read_64m").contains("<= 1.50 OVER"), "{table}");
        assert!(!line("create_release_4k").contains("met") && !line("create_release_4k").contains("OVER"));
        assert!(
            table.contains("targets: 2 of 4 met; over: write_4k_nb 1.12 (<= 1.11), map_read_64m 1.80 (<= 1.50)"),
            "{table}"
        );

        let (d, c) = runs(&workloads, false);
        let json: Value = serde_json::from_str(&render(&d, &c, 0, true)).unwrap();
        let t = &json["targets"];
        assert_eq!(t["map_read_64m"]["limit"].as_f64(), Some(2.0));
        assert_eq!(t["map_read_64m"]["met"].as_bool(), Some(true));
        assert_eq!(t["write_4k_nb"]["met"].as_bool(), Some(false));
        assert_eq!(t["enqueue_finish_roundtrip"]["kind"].as_str(), Some("added_us"));
        assert_eq!(t["enqueue_finish_roundtrip"]["value"].as_f64(), Some(2.5));
        assert!(t.get("create_release_4k").is_none());
    }

    #[test]
    fn table_shows_spread_ratio_and_throughput() {
        let table = render(&run(1e6, Some(1_000_000)), &run(2e6, Some(1_000_000)), 0, false);
        let line = table.lines().find(|l| l.starts_with("w ")).unwrap();
        assert!(line.contains("1.00 ms (0.90-1.10)") && line.contains("2.00 ms (1.80-2.20)"), "{line}");
        assert!(line.contains(" 2.00 ") && line.contains("1.00 / 0.50 GB/s"), "{line}");
        let line = table.lines().find(|l| l.starts_with("n ")).unwrap();
        assert!(line.contains("50 ns (40-70)") && line.contains("1.00"), "{line}");
        assert!(table.contains("0 busy processes"), "{table}");
    }

    /// A stand-in client: `sh` running `body` with `$1` = `--lockstep` and `$LOG` = `log`.
    fn fake(log: &std::path::Path, body: &str) -> Command {
        let mut cmd = Command::new("sh");
        cmd.arg("-c").arg(format!("[ \"$1\" = --lockstep ] || exit 9\n{body}")).arg("fake").env("LOG", log);
        cmd
    }

    /// A client's body: `role` starts, then per workload two blocks (waiting for the word to
    /// run each, with a stray line of a driver's before the first), then its result.
    fn client(role: &str, workloads: &[&str]) -> String {
        let mut body = format!("echo '{role} start' >> \"$LOG\"\necho 'a driver talking'\n");
        for w in workloads {
            for _ in 0..2 {
                let wait = lockstep::wait_line(w);
                body += &format!("echo '{wait}'\nread go || exit 3\necho '{role} {w}' >> \"$LOG\"\n");
            }
        }
        body + &format!("echo '{}'\n", lockstep::result_line(&format!("{{\"role\": \"{role}\"}}")))
    }

    fn log_file(name: &str) -> std::path::PathBuf {
        let dir = std::env::temp_dir().join(format!("cloister-bench-{}-{name}", std::process::id()));
        let _ = std::fs::remove_file(&dir);
        dir
    }

    #[test]
    fn the_clients_take_turns_block_by_block_and_the_caged_starts_after_the_direct_set_up() {
        let log = log_file("turns");
        let direct = fake(&log, &client("D", &["a", "b"]));
        let caged = fake(&log, &client("C", &["a", "b"]));
        let (d, c) = interleave(direct, caged).unwrap();
        assert_eq!((d["role"].as_str(), c["role"].as_str()), (Some("D"), Some("C")));
        let got = std::fs::read_to_string(&log).unwrap();
        let _ = std::fs::remove_file(&log);
        let want = "D start\nC start\nD a\nC a\nD a\nC a\nD b\nC b\nD b\nC b\n";
        assert_eq!(got, want);
    }

    #[test]
    fn clients_out_of_step_or_dying_are_errors_with_what_they_said() {
        let log = log_file("step");
        let err = interleave(fake(&log, &client("D", &["a", "b"])), fake(&log, &client("C", &["a", "c"])));
        assert!(err.as_ref().is_err_and(|e| e.contains("out of step") && e.contains("\"c\"")), "{err:?}");
        let dying = format!("echo '{}'\nread go\necho 'cannot map the buffer' >&2\nexit 4\n", lockstep::wait_line("a"));
        let err = interleave(fake(&log, &dying), fake(&log, &client("C", &["a"])));
        let _ = std::fs::remove_file(&log);
        let e = err.unwrap_err();
        assert!(e.contains("(direct)") && e.contains("cannot map the buffer") && e.contains('4'), "{e}");
    }

    #[test]
    fn pairs_of_processes_join_at_the_median_of_their_medians_and_of_their_ratios() {
        // Three direct processes at 10, 14 and 11 ns, three caged at 12, 30 and 13 (one drawn
        // slow); the throughput is per time, whatever its unit.
        let pair = |d: f64, c: f64| {
            let (mut d, mut c) =
                runs(&[("w", d, c), ("set_kernel_arg", d, c), ("enqueue_finish_roundtrip", d * 1e3, c * 1e3)], false);
            for r in d["results"].as_array_mut().unwrap().iter_mut().chain(c["results"].as_array_mut().unwrap()) {
                r["repeats"] = 5.into();
                r["throughput"] = (100.0 / r["median_ns"].as_f64().unwrap()).into();
            }
            d["results"][0]["min_ns"] = (d["results"][0]["median_ns"].as_f64().unwrap() - 1.0).into();
            (d, c)
        };
        let (d, c): (Vec<Value>, Vec<Value>) =
            [pair(10.0, 12.0), pair(14.0, 30.0), pair(11.0, 13.0)].into_iter().unzip();
        let (d, c) = (merge_pairs(&d), merge_pairs(&c));
        assert_eq!(d["pairs"].as_u64(), Some(3));
        let w = &d["results"][0];
        assert_eq!(w["median_ns"].as_f64(), Some(11.0));
        assert_eq!((w["min_ns"].as_f64(), w["max_ns"].as_f64()), (Some(9.0), Some(14.0)));
        assert_eq!(w["repeats"].as_u64(), Some(15));
        assert!((w["throughput"].as_f64().unwrap() - 100.0 / 11.0).abs() < 1e-9, "{w}");
        assert_eq!(c["results"][0]["median_ns"].as_f64(), Some(13.0));

        // The ratio is the median of the pairs' own (1.20, 2.14, 1.18), not 13 / 11 of the
        // joined medians; the added time likewise (+2, +16, +2 us).
        let json: Value = serde_json::from_str(&render(&d, &c, 0, true)).unwrap();
        let close = |a: f64, b: f64| (a - b).abs() < 1e-9;
        assert!(close(json["ratios"]["w"].as_f64().unwrap(), 1.2), "{json}");
        let pairs: Vec<f64> =
            json["pair_ratios"]["w"].as_array().unwrap().iter().map(|x| x.as_f64().unwrap()).collect();
        assert!(
            pairs.len() == 3 && pairs.iter().zip([1.2, 30.0 / 14.0, 13.0 / 11.0]).all(|(a, b)| close(*a, b)),
            "{pairs:?}"
        );
        assert!(close(json["targets"]["enqueue_finish_roundtrip"]["value"].as_f64().unwrap(), 2.0), "{json}");
        let table = render(&d, &c, 0, false);
        assert!(table.contains("in 3 pairs of fresh processes"), "{table}");
        let line = table.lines().find(|l| l.starts_with("set_kernel_arg ")).unwrap();
        assert!(line.contains(" 1.20  <= 2.00 met") && line.ends_with("1.20 2.14 1.18"), "{line}");

        // An even count: the mean of the middle two. One pair: no pairs column.
        assert_eq!(median(vec![4.0, 1.0, 3.0, 2.0]), Some(2.5));
        assert_eq!(median(Vec::new()), None);
        let (d, c) = pair(10.0, 30.0);
        let (d, c) = (merge_pairs(&[d]), merge_pairs(&[c]));
        let json: Value = serde_json::from_str(&render(&d, &c, 0, true)).unwrap();
        assert_eq!(json["ratios"]["w"].as_f64(), Some(3.0));
        assert!(d["results"][0]["pair_median_ns"].as_array().is_some_and(|a| a.len() == 1));
        let table = render(&d, &c, 0, false);
        let line = table.lines().find(|l| l.starts_with("w ")).unwrap();
        assert!(!table.contains("pairs") && line.ends_with("10.00 / 3.33"), "{table}");
    }

    #[test]
    fn short_rows_are_drawn_again_and_joined_over_all_their_pairs() {
        // Under 100 us a time directly and caged: drawn again. Over it on either side, or
        // the process's start: not.
        let whole = [
            ("write_4k_nb", 3_000.0, 4_000.0),
            ("write_1m", 99_000.0, 120_000.0),
            ("read_1m", 120_000.0, 40_000.0),
            ("set_kernel_arg", 20.0, 30.0),
            ("platform_init", 50_000.0, 90_000.0),
            ("write_64m", 5e6, 4e6),
        ];
        let (d, c) = runs(&whole, false);
        assert_eq!(short_rows(&d, &c), ["write_4k_nb", "set_kernel_arg"]);

        // One whole pair (the caged client drew a slow pace), then two further pairs of the
        // short rows alone: those rows join over three pairs, the others keep their one.
        let (d1, c1) = runs(&whole, false);
        let (d2, c2) = runs(&[("write_4k_nb", 4_000.0, 3_000.0), ("set_kernel_arg", 20.0, 20.0)], false);
        let (d3, c3) = runs(&[("write_4k_nb", 3_000.0, 3_000.0), ("set_kernel_arg", 20.0, 22.0)], false);
        let (mut d, mut c) = (merge_pairs(&[d1, d2, d3]), merge_pairs(&[c1, c2, c3]));
        for run in [&mut d, &mut c] {
            run["pairs"] = 1.into();
            run["draws"] = 3.into();
        }
        let json: Value = serde_json::from_str(&render(&d, &c, 0, true)).unwrap();
        let pairs = |name: &str| json["pair_ratios"][name].as_array().map_or(0, Vec::len);
        assert_eq!((pairs("write_4k_nb"), pairs("set_kernel_arg"), pairs("write_1m")), (3, 3, 0), "{json}");
        assert_eq!(json["ratios"]["write_4k_nb"].as_f64(), Some(1.0), "the median of 1.33, 0.75 and 1.00");
        assert_eq!(json["targets"]["write_4k_nb"]["met"].as_bool(), Some(true));
        assert!((json["ratios"]["write_1m"].as_f64().unwrap() - 120.0 / 99.0).abs() < 1e-9, "{json}");
        let table = render(&d, &c, 0, false);
        assert!(
            table
                .contains("in 1 pair of fresh processes one after the other, the rows of operations under 100 us in 3"),
            "{table}"
        );
        let line = table.lines().find(|l| l.starts_with("write_4k_nb ")).unwrap();
        assert!(line.ends_with("1.33 0.75 1.00"), "{line}");
    }

    #[test]
    fn a_workload_missing_from_one_run_is_left_out() {
        let mut caged = run(2.0, None);
        caged["results"].as_array_mut().unwrap().remove(0);
        let table = render(&run(1.0, None), &caged, 0, false);
        assert!(!table.lines().any(|l| l.starts_with("w ")) && table.lines().any(|l| l.starts_with("n ")), "{table}");
    }
}
