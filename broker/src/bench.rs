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

use serde_json::Value;

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
    if json {
        let ratios: serde_json::Map<String, Value> =
            rows.iter().filter_map(|r| Some((r.name.to_string(), Value::from(r.ratio()?)))).collect();
        let doc = serde_json::json!({ "load": load, "direct": direct, "caged": caged, "ratios": ratios });
        return format!("{}\n", serde_json::to_string_pretty(&doc).unwrap_or_default());
    }
    let mut out = format!(
        "cloister bench: {} on {}{}, {load} busy process{} beside each run\n\
         time per operation: median (min-max) over the repeats; ratio = caged / direct median \
         (1.00 = no cost; lower is better)\n\n",
        direct["device"].as_str().unwrap_or("?"),
        direct["platform"].as_str().unwrap_or("?"),
        if direct["quick"].as_bool() == Some(true) { " (quick)" } else { "" },
        if load == 1 { "" } else { "es" },
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

    #[test]
    fn a_workload_missing_from_one_run_is_left_out() {
        let mut caged = run(2.0, None);
        caged["results"].as_array_mut().unwrap().remove(0);
        let table = render(&run(1.0, None), &caged, 0, false);
        assert!(!table.lines().any(|l| l.starts_with("w ")) && table.lines().any(|l| l.starts_with("n ")), "{table}");
    }
}
