//! A private cage for one application run: a temporary directory holding the broker socket and
//! an ICD registry that names only cloister, plus the broker thread serving that socket.

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::broker::{self, BrokerConfig, WorkerOptions};

/// The cage options `cloister run` and friends take.
#[derive(clap::Args, Clone, Debug, Default)]
pub struct SandboxOptions {
    /// Use this sandbox profile (a built-in name: pocl, nvidia, generic; or a profile file)
    /// instead of the one chosen by the driver's library name.
    #[arg(long)]
    pub profile: Option<String>,
    /// Run the driver without rlimits, network namespace, landlock or seccomp (hygiene only).
    #[arg(long, conflicts_with = "require_sandbox")]
    pub no_sandbox: bool,
    /// Refuse to run a driver whose worker could not apply every sandbox layer.
    #[arg(long)]
    pub require_sandbox: bool,
}
use crate::drivers::{self, Driver};

impl SandboxOptions {
    /// Checks the options and the configuration before anything starts. A profile file is made
    /// absolute (the worker runs in its cache folder, where a relative path means something
    /// else) and parsed here, so a missing or malformed profile is one message naming the file
    /// and line; so is a malformed configuration file, and every profile it names; the
    /// `CLOISTER_*` settings are read once, so a bad value is said now (`settings::check_all`).
    /// The flags become the settings' top layer (`--profile`, `--require-sandbox`).
    pub fn resolve(&self) -> Result<Self, String> {
        self.resolve_with(true)
    }

    /// Like `resolve`; without `strict_files`, a malformed configuration file is said once and
    /// passed over (the defaults are used), as the shim does: the private broker a shim starts
    /// must serve it whatever the files say.
    pub fn resolve_with(&self, strict_files: bool) -> Result<Self, String> {
        use cloister_ipc::settings;
        let mut out = self.clone();
        if let Some(p) = &self.profile {
            if cloister_sandbox_policy::Profile::builtin(p).is_none() {
                cloister_sandbox_policy::Profile::load(p).map_err(|e| e.to_string())?;
                let abs = std::fs::canonicalize(p).map_err(|e| format!("profile {p}: {e}"))?;
                out.profile = Some(abs.to_string_lossy().into_owned());
            }
            settings::set_flag("profile", out.profile.as_deref().unwrap_or(p));
        }
        if self.require_sandbox {
            settings::set_flag("require_sandbox", "1");
        }
        match settings::check_all() {
            Err(e) if !strict_files => settings::say_once(&format!("{e} (the file is not used)")),
            other => other?,
        }
        check_profiles()?;
        Ok(out)
    }

    /// How the broker starts workers with these options.
    pub fn worker_options(
        &self,
        install: &Install,
        learn: Option<std::sync::Arc<crate::broker::LearnSink>>,
    ) -> WorkerOptions {
        WorkerOptions { worker: install.worker.clone(), no_sandbox: self.no_sandbox, learn, probe: false }
    }
}

/// Every profile the configuration files and `CLOISTER_PROFILE` name must load: a missing or
/// malformed one stops the run here with one message, as `--profile`'s does.
fn check_profiles() -> Result<(), String> {
    use cloister_ipc::config::Source;
    let files = cloister_ipc::settings::files();
    let mut named: Vec<(String, Source)> = Vec::new();
    for f in &files.files {
        for values in [&f.values].into_iter().chain(f.drivers.values().map(|d| &d.values)) {
            if let Some((p, line)) = values.get("profile") {
                named.push((p.clone(), Source::File { path: f.path.clone(), line: *line }));
            }
        }
    }
    let env = cloister_ipc::settings::resolve("profile", None);
    if let (Some(p), Source::Env) = (env.value, &env.source) {
        named.push((p, Source::Env));
    }
    for (p, source) in named {
        if let Err(e) = cloister_sandbox_policy::Profile::load(&p) {
            let at = match source {
                Source::Env => "CLOISTER_PROFILE".to_string(),
                other => other.to_string(),
            };
            return Err(format!("{at}: {e}"));
        }
    }
    Ok(())
}

/// Where the shim and worker live.
pub struct Install {
    pub shim: PathBuf,
    pub worker: PathBuf,
}

impl Install {
    /// Finds the shim and worker, in this order: `CLOISTER_SHIM`/`CLOISTER_WORKER`; beside the
    /// `cloister` binary (a workspace build); in `../lib/cloister/` from it (`cloister install`,
    /// a packaged install); the copies embedded in the binary (`cargo install`), unpacked into a
    /// private folder. If none has both, the error lists every place looked at.
    pub fn locate() -> Result<Self, String> {
        let exe = std::env::current_exe().map_err(|e| format!("cannot find own binary: {e}"))?;
        let dir = exe.parent().ok_or("binary has no directory")?.to_path_buf();
        let lib = dir.parent().map(|p| p.join("lib/cloister"));
        let var = |name: &str| std::env::var_os(name).map(PathBuf::from);
        let (shim_var, worker_var) = (var("CLOISTER_SHIM"), var("CLOISTER_WORKER"));
        let mut looked = Vec::new();
        for place in std::iter::once(Some(dir)).chain(std::iter::once(lib)).flatten() {
            let shim = shim_var.clone().unwrap_or_else(|| place.join("libcloister.so"));
            let worker = worker_var.clone().unwrap_or_else(|| place.join("cloister-worker"));
            if shim.exists() && worker.exists() {
                return Ok(Self { shim, worker });
            }
            for p in [shim, worker] {
                if !p.exists() && !looked.contains(&p) {
                    looked.push(p);
                }
            }
        }
        let unpacked = match crate::embedded::unpack() {
            Ok(Some((shim, worker))) => Ok((shim_var.unwrap_or(shim), worker_var.unwrap_or(worker))),
            Ok(None) => Err("this binary carries no embedded copies (a debug build: see broker/build.rs)".to_string()),
            Err(e) => Err(e),
        };
        match unpacked {
            Ok((shim, worker)) if shim.exists() && worker.exists() => Ok(Self { shim, worker }),
            Ok((shim, worker)) => Err(format!(
                "the shim or worker named by CLOISTER_SHIM/CLOISTER_WORKER is missing: {}, {}",
                shim.display(),
                worker.display()
            )),
            Err(why) => Err(format!(
                "cannot find cloister's shim (libcloister.so) and worker (cloister-worker); looked for {}; and {why}. \
                 Build the workspace (`cargo build`), install with `cargo install --path broker`, or set CLOISTER_SHIM and CLOISTER_WORKER",
                looked.iter().map(|p| p.display().to_string()).collect::<Vec<_>>().join(", ")
            )),
        }
    }
}

pub struct Cage {
    dir: PathBuf,
    socket: PathBuf,
    vendors: PathBuf,
    /// A registry naming the caged drivers themselves, to run the same drivers uncaged.
    direct_vendors: PathBuf,
    libdir: PathBuf,
}

impl Cage {
    /// Sets up the directory and starts the broker thread for `drivers`.
    pub fn start(install: &Install, drivers: Vec<Driver>, sandbox: &SandboxOptions) -> Result<Self, String> {
        Self::start_with(install, drivers, sandbox, None)
    }

    /// Like `start`; with `learn`, workers run observed and report what they did there.
    pub fn start_with(
        install: &Install,
        drivers: Vec<Driver>,
        sandbox: &SandboxOptions,
        learn: Option<&std::sync::Arc<crate::broker::LearnSink>>,
    ) -> Result<Self, String> {
        // A fresh folder with a random name, whatever the base: another user who can write to
        // the base (the shared /tmp without XDG_RUNTIME_DIR) cannot have prepared it.
        let base = std::env::var_os("XDG_RUNTIME_DIR")
            .map(PathBuf::from)
            .filter(|p| cloister_ipc::private::check_private(p).is_ok())
            .unwrap_or_else(std::env::temp_dir);
        let dir = cloister_ipc::private::fresh_dir(&base, "cloister-run-").map_err(|e| e.to_string())?;
        let vendors = dir.join("vendors");
        let direct_vendors = dir.join("direct-vendors");
        let libdir = dir.join("lib");
        std::fs::create_dir_all(&vendors).map_err(|e| e.to_string())?;
        std::fs::create_dir_all(&direct_vendors).map_err(|e| e.to_string())?;
        for d in &drivers {
            let file = direct_vendors.join(format!("{}.icd", d.name.replace('/', "_")));
            std::fs::write(file, format!("{}\n", d.library)).map_err(|e| e.to_string())?;
        }
        std::fs::create_dir_all(&libdir).map_err(|e| e.to_string())?;
        let shim = std::fs::canonicalize(&install.shim).map_err(|e| e.to_string())?;
        std::fs::write(vendors.join("cloister.icd"), format!("{}\n", shim.display())).map_err(|e| e.to_string())?;
        std::os::unix::fs::symlink(&shim, libdir.join("libOpenCL.so.1")).map_err(|e| e.to_string())?;
        std::os::unix::fs::symlink(&shim, libdir.join("libOpenCL.so")).map_err(|e| e.to_string())?;
        let socket = dir.join("broker.sock");
        let listener = broker::listen(&socket).map_err(|e| format!("cannot listen on {}: {e}", socket.display()))?;
        let options = sandbox.worker_options(install, learn.cloned());
        let config = BrokerConfig { options, drivers };
        std::thread::Builder::new()
            .name("broker".into())
            .spawn(move || broker::serve(listener, config))
            .map_err(|e| e.to_string())?;
        Ok(Self { dir, socket, vendors, direct_vendors, libdir })
    }

    /// Points `cmd`'s OpenCL at the cage: through the ICD loader, or with `drop_in`, by putting
    /// cloister first on the library path as `libOpenCL.so.1`.
    pub fn configure(&self, cmd: &mut Command, drop_in: bool) {
        cmd.env("CLOISTER_SOCKET", &self.socket);
        cmd.env(cloister_ipc::settings::ALREADY_SAID, "1");
        cmd.env("OCL_ICD_VENDORS", &self.vendors);
        cmd.env_remove("OCL_ICD_FILENAMES");
        if drop_in {
            let mut path = self.libdir.as_os_str().to_owned();
            if let Some(old) = std::env::var_os("LD_LIBRARY_PATH") {
                path.push(":");
                path.push(old);
            }
            cmd.env("LD_LIBRARY_PATH", path);
        }
    }

    pub fn socket(&self) -> &Path {
        &self.socket
    }

    /// Points `cmd` at the same drivers without the cage, for comparisons.
    pub fn configure_direct(&self, cmd: &mut Command) {
        cmd.env_remove("CLOISTER_SOCKET");
        cmd.env("OCL_ICD_VENDORS", &self.direct_vendors);
        cmd.env_remove("OCL_ICD_FILENAMES");
    }
}

impl Drop for Cage {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// The drivers to cage: all registered ones, or the one `--driver` names.
pub fn choose_drivers(install: &Install, want: Option<&str>) -> Result<Vec<Driver>, String> {
    let all = drivers::discover_all(&install.shim);
    crate::install::warn_visible_drivers(&install.shim);
    match want {
        Some(w) => Ok(vec![drivers::select(&all, w)?]),
        None if all.is_empty() => Err(format!(
            "no OpenCL drivers registered in {} (install one, e.g. `apt install pocl-opencl-icd`, or pass --driver PATH)",
            drivers::vendors_dirs().iter().map(|d| d.display().to_string()).collect::<Vec<_>>().join(" or ")
        )),
        None => Ok(all),
    }
}
