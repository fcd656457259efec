//! `cloister bench`'s report: the same workloads measured directly and through the cage, joined
//! by name, with the ratio of caged to direct median time per operation (> 1: the cage costs
//! that much).
//!
//! The JSON document (`--json`) is
//! `{ "load": N, "direct": RUN, "caged": RUN, "ratios": { NAME: caged/direct median time } }`,
//! where a RUN is what `cloister-bench-client` printed: `device`, `platform`, `quick`, and
//! `results`, one per workload: `name`, `ops_per_repeat`, `repeats`, `min_ns`, `median_ns`,
//! `max_ns` (time per operation), and where it applies `bytes_per_op`, `throughput` and
//! `throughput_unit` (at the median time).
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

/// One workload in both runs.
struct Row<'a> {
    name: &'a str,
    direct: &'a Value,
    caged: &'a Value,
}

impl Row<'_> {
    fn ratio(&self) -> Option<f64> {
        Some(self.caged["median_ns"].as_f64()? / self.direct["median_ns"].as_f64()?)
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

/// The report: a table, or with `json` a document holding both runs, the ratios and the load.
pub fn render(direct: &Value, caged: &Value, load: usize, json: bool) -> String {
    let rows = rows(direct, caged);
    let rounds = direct["rounds"].as_u64().unwrap_or(1);
    if json {
        let ratios: serde_json::Map<String, Value> =
            rows.iter().filter_map(|r| Some((r.name.to_string(), Value::from(r.ratio()?)))).collect();
        let doc = serde_json::json!({ "load": load, "direct": direct, "caged": caged, "ratios": ratios });
        return format!("{}\n", serde_json::to_string_pretty(&doc).unwrap_or_default());
    }
    let mut out = format!(
        "cloister bench: {} on {}{}, {load} busy process{} beside each run\n\
         time per operation: median (min-max) over the repeats, taken in {rounds} block{} per \
         workload, direct and caged in turns; ratio = caged / direct median (1.00 = no cost; \
         lower is better)\n\n",
        direct["device"].as_str().unwrap_or("?"),
        direct["platform"].as_str().unwrap_or("?"),
        if direct["quick"].as_bool() == Some(true) { " (quick)" } else { "" },
        if load == 1 { "" } else { "es" },
        if rounds == 1 { "" } else { "s" },
    );
    out.push_str(&format!(
        "{:<26} {:>27} {:>27} {:>8}  {}\n",
        "workload", "direct", "caged", "ratio", "throughput direct / caged"
    ));
    for r in &rows {
        let throughput = match (r.direct["throughput"].as_f64(), r.caged["throughput"].as_f64()) {
            (Some(d), Some(c)) => format!("{d:.2} / {c:.2} {}", r.direct["throughput_unit"].as_str().unwrap_or("")),
            _ => String::new(),
        };
        out.push_str(&format!(
            "{:<26} {:>27} {:>27} {:>8}  {}\n",
            r.name,
            spread(r.direct).unwrap_or_default(),
            spread(r.caged).unwrap_or_default(),
            r.ratio().map(|x| format!("{x:.2}")).unwrap_or_default(),
            throughput
        ));
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
    fn a_workload_missing_from_one_run_is_left_out() {
        let mut caged = run(2.0, None);
        caged["results"].as_array_mut().unwrap().remove(0);
        let table = render(&run(1.0, None), &caged, 0, false);
        assert!(!table.lines().any(|l| l.starts_with("w ")) && table.lines().any(|l| l.starts_with("n ")), "{table}");
    }
}
