//! `cloister run`'s flags for seeing what the application does (the shim's `intercept`
//! module): each sets the `CLOISTER_*` variable the shim reads, for the application alone.

use clap::Args;

#[derive(Args, Debug, Default)]
#[command(next_help_heading = "Seeing what the application does")]
pub struct ObserveOptions {
    /// Log every OpenCL call with its arguments, result, thread and time, to stderr or FILE (CLOISTER_LOG_CALLS).
    #[arg(long, value_name = "FILE", num_args = 0..=1, require_equals = true, default_missing_value = "-")]
    log_calls: Option<String>,
    /// Log only the calls that fail, to stderr or FILE (CLOISTER_LOG_ERRORS).
    #[arg(long, value_name = "FILE", num_args = 0..=1, require_equals = true, default_missing_value = "-")]
    log_errors: Option<String>,
    /// At exit, count and total/min/mean/max host time per entry point, to stderr or FILE (CLOISTER_TIMING).
    #[arg(long, value_name = "FILE", num_args = 0..=1, require_equals = true, default_missing_value = "-")]
    timing: Option<String>,
    /// Write a Chrome/Perfetto trace of the host calls, one track per thread (CLOISTER_TRACE).
    #[arg(long, value_name = "FILE.json")]
    trace: Option<String>,
    /// Dump program sources, build options, build logs and binaries into DIR (CLOISTER_DUMP).
    #[arg(long, value_name = "DIR")]
    dump: Option<String>,
    /// Replace program sources or binaries at creation from DIR, named as --dump names them (CLOISTER_INJECT).
    #[arg(long, value_name = "DIR")]
    inject: Option<String>,
    /// Append OPTS to every clBuildProgram's options (CLOISTER_BUILD_OPTIONS_APPEND).
    #[arg(long, value_name = "OPTS", allow_hyphen_values = true)]
    build_options_append: Option<String>,
    /// At exit, list the objects created and not released, per kind (CLOISTER_LEAKS).
    #[arg(long)]
    leaks: bool,
}

impl ObserveOptions {
    /// Sets the variables in our environment, which the application inherits. Paths are made
    /// absolute first, so an application that changes its directory still writes where asked.
    pub fn export(&self) {
        let absolute = |v: &str| match v {
            "-" => v.to_string(),
            path => std::path::absolute(path).map(|p| p.display().to_string()).unwrap_or_else(|_| path.to_string()),
        };
        let vars = [
            ("CLOISTER_LOG_CALLS", self.log_calls.as_deref().map(absolute)),
            ("CLOISTER_LOG_ERRORS", self.log_errors.as_deref().map(absolute)),
            ("CLOISTER_TIMING", self.timing.as_deref().map(absolute)),
            ("CLOISTER_TRACE", self.trace.as_deref().map(absolute)),
            ("CLOISTER_DUMP", self.dump.as_deref().map(absolute)),
            ("CLOISTER_INJECT", self.inject.as_deref().map(absolute)),
            ("CLOISTER_BUILD_OPTIONS_APPEND", self.build_options_append.clone()),
            ("CLOISTER_LEAKS", self.leaks.then(|| "1".to_string())),
        ];
        for (name, value) in vars {
            if let Some(v) = value {
                std::env::set_var(name, v);
            }
        }
    }
}
