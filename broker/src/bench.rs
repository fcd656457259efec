//! `cloister bench`'s report: the same workloads measured directly and through the cage, joined
//! by name, with the ratio of caged to direct time per operation (> 1: the cage costs that much).

use serde_json::Value;

/// Time per operation in nanoseconds, whatever unit the client used.
fn ns_per_op(r: &Value) -> Option<f64> {
    let v = r["value"].as_f64()?;
    match r["unit"].as_str()? {
        "ns/op" => Some(v),
        "us/op" => Some(v * 1e3),
        "ms/op" => Some(v * 1e6),
        _ => None,
    }
}

fn human(ns: f64) -> String {
    if ns >= 1e6 {
        format!("{:.2} ms", ns / 1e6)
    } else if ns >= 1e3 {
        format!("{:.1} us", ns / 1e3)
    } else {
        format!("{ns:.0} ns")
    }
}

/// One workload in both runs.
struct Row<'a> {
    name: &'a str,
    direct: f64,
    caged: f64,
    bytes: Option<f64>,
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
            Some(Row { name, direct: ns_per_op(d)?, caged: ns_per_op(c)?, bytes: d["bytes_per_op"].as_f64() })
        })
        .collect()
}

/// The report: a table, or with `json` a document holding both runs and the ratios.
pub fn render(direct: &Value, caged: &Value, json: bool) -> String {
    let rows = rows(direct, caged);
    if json {
        let ratios: serde_json::Map<String, Value> =
            rows.iter().map(|r| (r.name.to_string(), Value::from(r.caged / r.direct))).collect();
        let doc = serde_json::json!({ "direct": direct, "caged": caged, "ratios": ratios });
        return format!("{}\n", serde_json::to_string_pretty(&doc).unwrap_or_default());
    }
    let mut out = format!(
        "cloister bench: {} on {}\nratio = caged / direct time per operation (1.00 = no cost; lower is better)\n\n",
        direct["device"].as_str().unwrap_or("?"),
        direct["platform"].as_str().unwrap_or("?")
    );
    out.push_str(&format!(
        "{:<26} {:>12} {:>12} {:>8} {:>20}\n",
        "workload", "direct", "caged", "ratio", "GB/s direct/caged"
    ));
    for r in &rows {
        let bw = r.bytes.map(|b| format!("{:.2} / {:.2}", b / r.direct, b / r.caged)).unwrap_or_default();
        out.push_str(&format!(
            "{:<26} {:>12} {:>12} {:>8.2} {:>20}\n",
            r.name,
            human(r.direct),
            human(r.caged),
            r.caged / r.direct,
            bw
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(value_us: f64, bytes: Option<u64>) -> Value {
        let mut r = serde_json::json!({ "name": "w", "unit": "us/op", "value": value_us });
        if let Some(b) = bytes {
            r["bytes_per_op"] = b.into();
        }
        serde_json::json!({ "device": "d", "platform": "p", "results": [r, { "name": "n", "unit": "ns/op", "value": 50.0 }] })
    }

    #[test]
    fn ratio_is_caged_over_direct_time_per_op() {
        let json: Value = serde_json::from_str(&render(&run(10.0, None), &run(25.0, None), true)).unwrap();
        assert_eq!(json["ratios"]["w"].as_f64(), Some(2.5));
        assert_eq!(json["ratios"]["n"].as_f64(), Some(1.0));
    }

    #[test]
    fn table_shows_both_figures_ratio_and_bandwidth() {
        let table = render(&run(1000.0, Some(1_000_000)), &run(2000.0, Some(1_000_000)), false);
        let line = table.lines().find(|l| l.starts_with("w ")).unwrap();
        assert!(line.contains("1.00 ms") && line.contains("2.00 ms") && line.contains("2.00"), "{line}");
        assert!(line.contains("1.00 / 0.50"), "{line}");
    }
}
