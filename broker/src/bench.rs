//! Placeholder until the benchmark renderer lands (being written in parallel).
pub fn render(direct: &serde_json::Value, caged: &serde_json::Value, _json: bool) -> String {
    format!("{direct}\n{caged}\n")
}
