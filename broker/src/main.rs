//! `cloister`: run OpenCL applications with their drivers caged.

mod bench;
mod broker;
mod cage;
mod carried;
mod config_cmd;
mod drivers;
mod embedded;
mod install;
/// The bench client's lines (its printing half is the client's).
#[allow(dead_code)]
mod lockstep;
mod observe;
mod probe;
mod reports;
mod watchdog;

use std::process::{Command, ExitCode};
use std::sync::atomic::{AtomicI32, Ordering};

use clap::{Parser, Subcommand};

use cage::{Cage, Install};

#[derive(Parser)]
#[command(
    name = "cloister",
    version,
    about = "Run OpenCL drivers in a cage: a driver crash no longer takes the application down"
)]
struct Cli {
    #[command(subcommand)]
    command: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Run APP with its OpenCL calls forwarded to caged driver workers.
    Run {
        /// Cage only this driver: an .icd name in the vendor registry (e.g. `pocl`) or a library path.
        #[arg(long)]
        driver: Option<String>,
        /// Put cloister first on LD_LIBRARY_PATH as libOpenCL.so.1 instead of going through the ICD loader.
        #[arg(long)]
        drop_in: bool,
        /// Skip the start-up check (each driver started once in its cage before the application,
        /// so that a driver that cannot work stops the run with one message): the application
        /// then meets a broken driver itself, as CL_DEVICE_NOT_AVAILABLE or no platform.
        #[arg(long)]
        no_check: bool,
        #[command(flatten)]
        sandbox: cage::SandboxOptions,
        #[command(flatten)]
        observe: observe::ObserveOptions,
        /// The application and its arguments (after `--` when they start with a dash). An option
        /// cloister does not know is an error, never taken for the application.
        #[arg(required = true, trailing_var_arg = true)]
        app: Vec<String>,
    },
    /// List the registered drivers cloister would cage.
    Drivers,
    /// Show each driver in its cage: the sandbox profile, every layer (and why one is off),
    /// and the platforms and devices the caged worker reports.
    Info {
        /// Only this driver.
        #[arg(long)]
        driver: Option<String>,
        #[command(flatten)]
        sandbox: cage::SandboxOptions,
    },
    /// Run a broker: for this user on $XDG_RUNTIME_DIR/cloister/broker.sock (applications whose
    /// OpenCL goes through the cloister ICD find it there), or on --socket.
    Broker {
        /// Listen here instead of the per-user socket.
        #[arg(long)]
        socket: Option<std::path::PathBuf>,
        /// Cage only this driver.
        #[arg(long)]
        driver: Option<String>,
        /// Exit when the process that started this broker exits (the shim's private broker).
        #[arg(long, hide = true)]
        exit_with_parent: bool,
        #[command(flatten)]
        sandbox: cage::SandboxOptions,
    },
    /// Crash reports: newest first, grouped by signature with counts; `show ID` prints one,
    /// `clear` removes them. The newest CLOISTER_CRASH_KEEP (200) reports younger than
    /// CLOISTER_CRASH_KEEP_DAYS (90) are kept; older ones go when a new one is written.
    Crashes {
        #[command(subcommand)]
        action: Option<CrashesCmd>,
    },
    /// Sandbox profiles: list, show, and learn a new one from a driver's behaviour.
    Policy {
        #[command(subcommand)]
        action: PolicyCmd,
    },
    /// Cage every OpenCL application of the machine (--system, as root) or of this user (--user),
    /// without `cloister run`: copies cloister where its pieces find each other, registers it with
    /// the ICD loader, hides the drivers' own .icd files, installs the broker's systemd user unit.
    Install(install::InstallArgs),
    /// Undo exactly what `cloister install` did (its manifest says what).
    Uninstall(install::UninstallArgs),
    /// Print every setting's value in effect and where it came from (flag, environment, file
    /// and line, default), per driver too; `--check FILE` checks a configuration file.
    Config(config_cmd::ConfigArgs),
    /// Print the coverage table of every OpenCL entry point (Markdown, as in the README).
    Coverage,
    /// Print a shell completion script (e.g. `cloister completions bash > /etc/bash_completion.d/cloister`).
    Completions {
        #[arg(value_enum)]
        shell: clap_complete::Shell,
    },
    /// Print the manual page, in roff (`cloister manpage > cloister.1; man ./cloister.1`).
    Manpage,
    /// Print the timing report of a running application started with --timing (every such
    /// application at the broker, without PID): asked of its shim through its broker, while it runs.
    Timing {
        /// The application's process id; its broker is the one its CLOISTER_SOCKET names
        /// (as `cloister run` sets it), else the per-user broker.
        pid: Option<u32>,
        /// Ask the broker listening here.
        #[arg(long)]
        socket: Option<std::path::PathBuf>,
    },
    /// Run the same micro-benchmarks directly on the driver and through the cage; print both,
    /// the ratio, and whether each meets its target.
    Bench {
        /// Benchmark this driver (default: the first registered one).
        #[arg(long)]
        driver: Option<String>,
        /// Print JSON instead of a table.
        #[arg(long)]
        json: bool,
        /// Shorter runs (noisier figures), for smoke tests.
        #[arg(long)]
        quick: bool,
        /// Keep N busy processes spinning beside both runs, so caged and direct are measured
        /// under the same load.
        #[arg(long, value_name = "N", default_value_t = 0)]
        load: usize,
        /// Run only the workloads whose names contain one of these comma-separated strings.
        #[arg(long, value_name = "PATTERN")]
        only: Option<String>,
        /// Measure each workload in N blocks, the direct and the caged run taking turns block by
        /// block (1: one block each, still in turns).
        #[arg(long, value_name = "N", default_value_t = 4, value_parser = clap::value_parser!(u32).range(1..=50))]
        rounds: u32,
        /// Measure in N pairs of fresh client processes (a direct one and a caged one with a
        /// worker of its own), one pair after the other; a row's time is the median of the
        /// pairs' medians, its ratio the median of the pairs' own. A driver's pace differs from
        /// one process to the next. Default: 3, 1 with --quick.
        #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..=20))]
        pairs: Option<u32>,
        /// Measure the rows of short operations (under 100 us, directly and caged) in further
        /// pairs of fresh processes, those rows alone, until each has N pairs: their figures
        /// follow the pace each process's driver drew at its start. Default: 15, with --quick
        /// as many as --pairs.
        #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..=50))]
        draws: Option<u32>,
        #[command(flatten)]
        sandbox: cage::SandboxOptions,
    },
}

#[derive(Subcommand)]
enum CrashesCmd {
    /// Print one report readably (ID as listed, or `latest`).
    Show { id: String },
    /// Remove every report (unreadable ones too), or only those older than DAYS.
    Clear {
        #[arg(long, value_name = "DAYS")]
        older_than: Option<u64>,
    },
}

#[derive(Subcommand)]
enum PolicyCmd {
    /// The built-in profiles.
    List,
    /// Print a built-in profile (the reviewed source file).
    Show { name: String },
    /// Check a profile file without running anything: every key known, every system call,
    /// ioctl and socket domain named correctly. Exit status 1 and the file, line and reason if not.
    Check { file: std::path::PathBuf },
    /// Run APP with the driver observed rather than confined, then write a profile that allows
    /// exactly what it used, with comments, for review.
    Learn {
        /// The driver to observe (.icd name or library path).
        #[arg(long)]
        driver: String,
        /// Where to write the profile (default: standard output).
        #[arg(long)]
        output: Option<std::path::PathBuf>,
        #[arg(required = true, trailing_var_arg = true, allow_hyphen_values = true)]
        app: Vec<String>,
    },
}

static CHILD: AtomicI32 = AtomicI32::new(0);

/// The catchable signals `cloister run` passes on to the application (not SIGCHLD, SIGPIPE,
/// or the stop signals the terminal sends to the whole foreground group anyway).
const FORWARDED_SIGNALS: [libc::c_int; 9] = [
    libc::SIGHUP,
    libc::SIGINT,
    libc::SIGQUIT,
    libc::SIGUSR1,
    libc::SIGUSR2,
    libc::SIGALRM,
    libc::SIGTERM,
    libc::SIGWINCH,
    libc::SIGCONT,
];

/// Signals that arrived before the application's pid was known (it may already run, and be
/// told about, before `spawn` returns here): one bit each, sent on once the pid is stored.
static PENDING_SIGNALS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

extern "C" fn forward_signal(sig: libc::c_int) {
    let pid = CHILD.load(Ordering::SeqCst);
    if pid > 0 {
        // SAFETY: kill is async-signal-safe.
        unsafe { libc::kill(pid, sig) };
    } else if (0..64).contains(&sig) {
        PENDING_SIGNALS.fetch_or(1 << sig, Ordering::SeqCst);
    }
}

/// Sends the application the signals that came before its pid was stored.
fn forward_pending_signals(pid: i32) {
    let pending = PENDING_SIGNALS.swap(0, Ordering::SeqCst);
    for sig in (0..64).filter(|s| pending & (1 << s) != 0) {
        // SAFETY: signalling our own child.
        unsafe { libc::kill(pid, sig) };
    }
}

fn main() -> ExitCode {
    // A closed pipe (`cloister crashes | head`) ends us quietly, as it does any CLI tool. Our
    // sockets send with MSG_NOSIGNAL, so this only concerns stdout and stderr.
    // SAFETY: restoring the default action of a signal.
    unsafe { libc::signal(libc::SIGPIPE, libc::SIG_DFL) };
    let cli = Cli::parse();
    cloister_ipc::log::init_program(match cli.command {
        Cmd::Broker { .. } => "broker",
        Cmd::Run { .. } => "run",
        _ => "cli",
    });
    let result = match cli.command {
        Cmd::Run { driver, drop_in, no_check, sandbox, observe, app } => {
            observe.export();
            run(driver.as_deref(), drop_in, no_check, &sandbox, &app)
        }
        Cmd::Drivers => list_drivers(),
        Cmd::Policy { action } => policy(action),
        Cmd::Crashes { action } => crashes(action),
        Cmd::Info { driver, sandbox } => info(driver.as_deref(), &sandbox),
        Cmd::Broker { socket, driver, exit_with_parent, sandbox } => {
            run_broker(socket, driver.as_deref(), exit_with_parent, &sandbox)
        }
        Cmd::Completions { shell } => {
            use clap::CommandFactory;
            clap_complete::generate(shell, &mut Cli::command(), "cloister", &mut std::io::stdout());
            Ok(ExitCode::SUCCESS)
        }
        Cmd::Manpage => {
            use clap::CommandFactory;
            clap_mangen::Man::new(Cli::command())
                .render(&mut std::io::stdout())
                .map(|()| ExitCode::SUCCESS)
                .map_err(|e| format!("cannot write the manual page: {e}"))
        }
        Cmd::Install(args) => install::install(&args),
        Cmd::Uninstall(args) => install::uninstall(&args),
        Cmd::Config(args) => config_cmd::run(args),
        Cmd::Timing { pid, socket } => reports::cli(pid, socket),
        Cmd::Coverage => {
            print!("{}", cloister_ipc::dispatch::coverage_markdown());
            Ok(ExitCode::SUCCESS)
        }
        Cmd::Bench { driver, json, quick, load, only, rounds, pairs, draws, sandbox } => {
            let pairs = pairs.unwrap_or(if quick { 1 } else { 3 });
            let draws = draws.unwrap_or(if quick { pairs } else { 15 }).max(pairs);
            run_bench(driver.as_deref(), &BenchOptions { json, quick, load, only, rounds, pairs, draws }, &sandbox)
        }
    };
    match result {
        Ok(code) => code,
        Err(e) => {
            eprintln!("cloister: {e}");
            ExitCode::from(125)
        }
    }
}

fn list_drivers() -> Result<ExitCode, String> {
    let install = Install::locate()?;
    for d in drivers::discover_all(&install.shim) {
        println!("{}\t{}", d.name, d.library);
    }
    Ok(ExitCode::SUCCESS)
}

fn run(
    driver: Option<&str>,
    drop_in: bool,
    no_check: bool,
    sandbox: &cage::SandboxOptions,
    app: &[String],
) -> Result<ExitCode, String> {
    let install = Install::locate()?;
    let sandbox = &sandbox.resolve()?;
    let drivers = cage::choose_drivers(&install, driver)?;
    // Each driver is started once in its cage before the application: a driver that cannot be
    // used is one message now, not crashed workers later and an application without OpenCL.
    let drivers = match no_check {
        true => drivers,
        false => probe::usable(&sandbox.worker_options(&install, None), drivers, driver.is_some())?,
    };
    let cage = Cage::start(&install, drivers, sandbox)?;
    run_app(cage, drop_in, app)
}

fn policy(action: PolicyCmd) -> Result<ExitCode, String> {
    use cloister_sandbox_policy::profile::BUILTIN;
    match action {
        PolicyCmd::List => {
            for (name, _) in BUILTIN {
                let p = cloister_sandbox_policy::Profile::builtin(name).ok_or("bad built-in profile")?;
                let libs =
                    if p.libraries.is_empty() { "(any other driver)".to_string() } else { p.libraries.join(", ") };
                println!("{name}\t{libs}");
            }
        }
        PolicyCmd::Check { file } => {
            let path = file.to_string_lossy();
            let p = match cloister_sandbox_policy::Profile::load(&path) {
                Ok(p) => p,
                Err(e) => {
                    eprintln!("cloister: {e}");
                    return Ok(ExitCode::from(1));
                }
            };
            println!(
                "{path}: profile {} is valid ({} system calls{}, spawning {})",
                p.name,
                p.seccomp.allow.len(),
                if p.libraries.is_empty() { String::new() } else { format!(", for {}", p.libraries.join(", ")) },
                if p.spawn { format!("allowed, at most {} processes", p.limits.processes) } else { "refused".into() }
            );
        }
        PolicyCmd::Show { name } => {
            let (_, text) =
                BUILTIN.iter().find(|(n, _)| *n == name).ok_or_else(|| format!("no built-in profile {name}"))?;
            print!("{text}");
        }
        PolicyCmd::Learn { driver, output, app } => {
            let install = Install::locate()?;
            let drivers = cage::choose_drivers(&install, Some(&driver))?;
            let sink = std::sync::Arc::new(broker::LearnSink::default());
            let cage = Cage::start_with(&install, drivers, &cage::SandboxOptions::default(), Some(&sink))?;
            let code = run_app(cage, false, &app)?;
            // The workers end when the application does; wait for their observers.
            let observers: Vec<_> = std::mem::take(&mut *sink.observers.lock().unwrap_or_else(|e| e.into_inner()));
            for o in observers {
                let _ = o.join();
            }
            // Every process of the application got its own worker: learn from all of them.
            let results = sink.results.lock().unwrap_or_else(|e| e.into_inner());
            let Some((d, _)) = results.first() else {
                return Err("the application never used the driver: nothing was learned".into());
            };
            let mut merged = cloister_sandbox_policy::learn::Observed::default();
            for (_, seen) in results.iter() {
                merged.merge(seen);
            }
            let seen = &merged;
            let stem =
                std::path::Path::new(&d.name).file_stem().map(|s| s.to_string_lossy().into_owned()).unwrap_or_default();
            let name = format!("learned-{stem}");
            let text = cloister_sandbox_policy::learn::write_profile(&name, &d.library, &app.join(" "), seen);
            match output {
                Some(path) => {
                    std::fs::write(&path, text).map_err(|e| format!("cannot write {}: {e}", path.display()))?;
                    eprintln!(
                        "cloister: wrote profile {name} ({} system calls) to {}",
                        seen.calls.len(),
                        path.display()
                    );
                }
                None => print!("{text}"),
            }
            return Ok(code);
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// Runs the application against `cage`, passing its exit status (or signal) through.
fn run_app(cage: Cage, drop_in: bool, app: &[String]) -> Result<ExitCode, String> {
    let mut cmd = Command::new(&app[0]);
    cmd.args(&app[1..]);
    cage.configure(&mut cmd, drop_in);
    // Every signal a user or a job controller sends to `cloister run` is meant for the
    // application, as with `timeout` and `bwrap`: forwarded, never the end of cloister alone.
    // Installed before the application starts, so none arriving early kills cloister alone.
    for sig in FORWARDED_SIGNALS {
        // SAFETY: installing an async-signal-safe handler.
        unsafe { libc::signal(sig, forward_signal as *const () as libc::sighandler_t) };
    }
    tracing::info!(app = ?app, "starting the application");
    let mut child = match cmd.spawn() {
        Ok(c) => c,
        Err(e) => {
            // As shells and `env`/`timeout` say it: 127 not found, 126 found but not runnable.
            eprintln!("cloister: cannot run {}: {e}", app[0]);
            let code = if e.kind() == std::io::ErrorKind::NotFound { 127 } else { 126 };
            return Ok(ExitCode::from(code));
        }
    };
    CHILD.store(child.id() as i32, Ordering::SeqCst);
    forward_pending_signals(child.id() as i32);
    let status = child.wait().map_err(|e| e.to_string())?;
    tracing::info!(%status, "the application ended");
    // The application's workers end with it; let their reapers finish their reports.
    broker::drain_workers(std::time::Duration::from_secs(3));
    drop(cage);
    use std::os::unix::process::ExitStatusExt;
    if let Some(code) = status.code() {
        return Ok(ExitCode::from(code as u8));
    }
    if let Some(sig) = status.signal() {
        // Die the same way, so the caller's shell sees the same signal; but without a core
        // dump of cloister itself (the application's own core, if any, is already written).
        let no_core = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
        // SAFETY: lowering our own core limit; restoring the default action and re-raising on
        // ourselves.
        unsafe {
            libc::setrlimit(libc::RLIMIT_CORE, &no_core);
            libc::signal(sig, libc::SIG_DFL);
            libc::raise(sig);
        }
        return Ok(ExitCode::from(128 + sig as u8));
    }
    Ok(ExitCode::FAILURE)
}

/// `cloister bench`'s flags beside the driver and the sandbox.
struct BenchOptions {
    json: bool,
    quick: bool,
    load: usize,
    only: Option<String>,
    rounds: u32,
    /// Pairs of fresh client processes, one pair after the other (`bench::merge_pairs`).
    pairs: u32,
    /// Pairs in all for the rows of short operations (`bench::short_rows`), at least `pairs`.
    draws: u32,
}

/// `--load`'s busy processes: killed (and reaped) when this goes, whichever way `run_bench`
/// ends; each also gets SIGKILL from the kernel if `cloister` itself dies first.
struct Load(Vec<std::process::Child>);

impl Load {
    fn start(client: &std::path::Path, n: usize) -> Result<Self, String> {
        use std::os::unix::process::CommandExt;
        let mut load = Load(Vec::with_capacity(n));
        for _ in 0..n {
            let mut cmd = Command::new(client);
            cmd.arg("--spin").stdin(std::process::Stdio::null());
            // SAFETY: prctl is async-signal-safe and touches only the child being started.
            unsafe {
                cmd.pre_exec(|| match libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) {
                    0 => Ok(()),
                    _ => Err(std::io::Error::last_os_error()),
                });
            }
            let child = cmd.spawn().map_err(|e| format!("cannot start a busy process ({}): {e}", client.display()))?;
            load.0.push(child);
        }
        Ok(load)
    }
}

impl Drop for Load {
    fn drop(&mut self) {
        for child in &mut self.0 {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

fn run_bench(driver: Option<&str>, opts: &BenchOptions, sandbox: &cage::SandboxOptions) -> Result<ExitCode, String> {
    let install = Install::locate()?;
    // Beside the worker (a build tree, a system install), else beside this binary (`cargo
    // install` puts it there, while the worker is the unpacked embedded copy).
    let beside_exe = std::env::current_exe().ok().map(|e| e.with_file_name("cloister-bench-client"));
    let candidates: Vec<std::path::PathBuf> =
        std::iter::once(install.worker.with_file_name("cloister-bench-client")).chain(beside_exe).collect();
    let client = candidates.iter().find(|p| p.exists()).cloned().ok_or_else(|| {
        let tried: Vec<String> = candidates.iter().map(|p| p.display().to_string()).collect();
        format!("benchmark client cloister-bench-client not found (looked at {})", tried.join(", "))
    })?;
    let sandbox = &sandbox.resolve()?;
    let mut drivers = cage::choose_drivers(&install, driver)?;
    drivers.truncate(1);
    let cage = Cage::start(&install, drivers, sandbox)?;
    // `names`: the further draws' rows, by their whole names.
    let client_command = |caged: bool, names: Option<&str>| {
        let mut cmd = Command::new(&client);
        if opts.quick {
            cmd.arg("--quick");
        }
        if let Some(only) = &opts.only {
            cmd.arg("--only").arg(only);
        }
        if let Some(names) = names {
            cmd.arg("--names").arg(names);
        }
        cmd.arg("--rounds").arg(opts.rounds.to_string());
        if caged {
            cage.configure(&mut cmd, false);
        } else {
            cage.configure_direct(&mut cmd);
        }
        cmd
    };
    let load = Load::start(&client, opts.load)?;
    let (mut direct, mut caged) = (Vec::new(), Vec::new());
    for _ in 0..opts.pairs {
        let (d, c) = bench::interleave(client_command(false, None), client_command(true, None))?;
        direct.push(d);
        caged.push(c);
    }
    let short = bench::short_rows(&bench::merge_pairs(&direct), &bench::merge_pairs(&caged));
    let further = if short.is_empty() { 0 } else { opts.draws - opts.pairs };
    let names = short.join(",");
    for _ in 0..further {
        let (d, c) = bench::interleave(client_command(false, Some(&names)), client_command(true, Some(&names)))?;
        direct.push(d);
        caged.push(c);
    }
    drop(load);
    let (mut direct, mut caged) = (bench::merge_pairs(&direct), bench::merge_pairs(&caged));
    for run in [&mut direct, &mut caged] {
        run["pairs"] = opts.pairs.into();
        run["draws"] = (opts.pairs + further).into();
    }
    print!("{}", bench::render(&direct, &caged, opts.load, opts.json));
    Ok(ExitCode::SUCCESS)
}

fn info(driver: Option<&str>, sandbox: &cage::SandboxOptions) -> Result<ExitCode, String> {
    let install = Install::locate()?;
    let sandbox = &sandbox.resolve()?;
    let drivers = cage::choose_drivers(&install, driver)?;
    let wanted = drivers.len();
    let cage = Cage::start(&install, drivers, sandbox)?;
    // This process becomes the application: the shim, linked in, connects to our own broker.
    std::env::set_var("CLOISTER_SOCKET", cage.socket());
    let workers = cloister::cage_summary();
    for w in &workers {
        println!("driver {}", w.driver);
        println!("  sandbox profile: {}", w.profile);
        for layer in &w.layers {
            // Named by the worker: escaped before they reach a terminal.
            println!("    {}", cloister_crash_reports::escape(layer, false));
        }
        for (platform, devices) in &w.platforms {
            println!("  platform: {platform}");
            for d in devices {
                println!(
                    "    device: {} ({}, {})",
                    d.name,
                    d.kind,
                    if d.available { "available" } else { "unavailable" }
                );
            }
        }
    }
    if workers.len() < wanted {
        return Err(format!(
            "{} of {wanted} drivers could not be started (see the messages above)",
            wanted - workers.len()
        ));
    }
    Ok(ExitCode::SUCCESS)
}

fn crashes(action: Option<CrashesCmd>) -> Result<ExitCode, String> {
    use cloister_crash_reports as reports;
    let dir = reports::crash_dir().ok_or("no state directory (set HOME or XDG_STATE_HOME)")?;
    let (all, corrupt) = reports::scan(&dir);
    // Report files are data, possibly written by a hostile worker's run: escaped.
    let e = |t: &str| reports::escape(t, false);
    match action {
        None => {
            if all.is_empty() && corrupt.is_empty() {
                println!("no crash reports in {}", dir.display());
                return Ok(ExitCode::SUCCESS);
            }
            println!("{:>5}  {:<23}  {:<60}  cause", "count", "latest", "signature");
            for (signature, count, newest) in reports::group(&all) {
                println!(
                    "{count:>5}  {:<23}  {:<60}  {}",
                    reports::human_time(newest.report.time),
                    e(&signature),
                    e(&newest.report.cause.describe())
                );
                let app = newest.report.application.as_ref().map(|a| format!(", {}", e(&a.name))).unwrap_or_default();
                println!("{:>5}  {:<23}  id {}{app}", "", "", e(&newest.id));
                if let Some(c) = &newest.report.carried_over {
                    println!("{:>5}  {:<23}  {}", "", "", e(&c.describe()));
                }
            }
            for c in &corrupt {
                println!("  corrupt: {} ({})", e(&c.path.display().to_string()), e(&c.error));
            }
            println!(
                "\n{} reports{} in {}; `cloister crashes show ID` prints one, `cloister crashes clear` removes them",
                all.len(),
                if corrupt.is_empty() { String::new() } else { format!(" and {} unreadable files", corrupt.len()) },
                dir.display()
            );
        }
        Some(CrashesCmd::Show { id }) => {
            let found = if id == "latest" { all.first() } else { all.iter().find(|s| s.id == id) };
            if let Some(s) = found {
                print!("{}", reports::render(s));
            } else if let Some(c) = corrupt.iter().find(|c| c.id == id) {
                return Err(format!(
                    "crash report {} ({}) is corrupt: {}",
                    e(&id),
                    e(&c.path.display().to_string()),
                    e(&c.error)
                ));
            } else {
                return Err(format!("no crash report {} in {}", e(&id), dir.display()));
            }
        }
        Some(CrashesCmd::Clear { older_than }) => {
            let n = reports::clear(&dir, older_than, reports::now())
                .map_err(|err| format!("cannot remove reports in {}: {err}", dir.display()))?;
            println!("removed {n} files from {}", dir.display());
        }
    }
    Ok(ExitCode::SUCCESS)
}

fn run_broker(
    socket: Option<std::path::PathBuf>,
    driver: Option<&str>,
    exit_with_parent: bool,
    sandbox: &cage::SandboxOptions,
) -> Result<ExitCode, String> {
    use std::os::unix::fs::DirBuilderExt;
    let install = Install::locate()?;
    let sandbox = &sandbox.resolve_with(!exit_with_parent)?;
    let drivers = cage::choose_drivers(&install, driver)?;
    let path = match socket {
        // A folder the caller named: made private if we create it; if it exists, it is theirs
        // to choose (the shim's private broker passes a fresh mkdtemp folder).
        Some(path) => {
            let dir = path.parent().ok_or("socket path has no folder")?;
            if !dir.exists() {
                std::fs::DirBuilder::new()
                    .recursive(true)
                    .mode(0o700)
                    .create(dir)
                    .map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
            }
            path
        }
        // The per-user socket: every folder on the way must be ours and private, never one
        // another user prepared.
        None => {
            let (base, path) = cloister_ipc::private::user_socket();
            let dir = path.parent().ok_or("socket path has no folder")?;
            cloister_ipc::private::ensure_private_under(&base, dir).map_err(|e| e.to_string())?;
            path
        }
    };
    if path.exists() {
        // A live broker answers; a stale socket from a dead one is replaced.
        if std::os::unix::net::UnixStream::connect(&path).is_ok() || seqpacket_alive(&path) {
            return Err(format!("a broker is already listening on {}", path.display()));
        }
        let _ = std::fs::remove_file(&path);
    }
    let listener = broker::listen(&path).map_err(|e| format!("cannot listen on {}: {e}", path.display()))?;
    let names: Vec<&str> = drivers.iter().map(|d| d.name.as_str()).collect();
    if !exit_with_parent {
        eprintln!("cloister broker: listening on {} for {}", path.display(), names.join(", "));
    }
    let options = sandbox.worker_options(&install, None);
    if exit_with_parent {
        // SAFETY: getppid cannot fail.
        let parent = unsafe { libc::getppid() };
        let socket_path = path.clone();
        std::thread::spawn(move || loop {
            std::thread::sleep(std::time::Duration::from_millis(500));
            // SAFETY: as above.
            if unsafe { libc::getppid() } != parent {
                let _ = std::fs::remove_file(&socket_path);
                if let Some(dir) = socket_path.parent() {
                    let _ = std::fs::remove_dir(dir);
                }
                std::process::exit(0);
            }
        });
    }
    broker::serve(listener, broker::BrokerConfig { options, drivers });
    Ok(ExitCode::SUCCESS)
}

fn seqpacket_alive(path: &std::path::Path) -> bool {
    cloister_ipc::channel::connect_seqpacket(path).is_ok()
}
