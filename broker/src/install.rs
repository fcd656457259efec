//! `cloister install --system|--user` and `cloister uninstall`: cage every OpenCL application of
//! the machine or of one user, without `cloister run`, and undo exactly that.
//!
//! Applications find OpenCL drivers through the ICD loader (ocl-icd or the Khronos loader), which
//! loads every `.icd` file of `/etc/OpenCL/vendors`, or of the folder `OCL_ICD_VENDORS` names
//! (both loaders honour it). Registering cloister beside the drivers is not enough: the
//! application would list each driver twice, once caged and once not. So:
//!
//! - `--system` (root) copies the three pieces into PREFIX (`bin/cloister`,
//!   `lib/cloister/{libcloister.so,cloister-worker}`), writes `/etc/OpenCL/vendors/cloister.icd`,
//!   and moves the drivers' own `.icd` files to `/etc/cloister/vendors/`, where cloister reads
//!   them (`drivers::vendors_dirs`) and the loaders do not. A file a Debian package owns is moved
//!   with `dpkg-divert --rename`, so that the package's upgrades write it there too; another is
//!   moved. A driver `.icd` that comes back anyway is said (once, by every cloister start:
//!   `warn_visible_drivers`) with the fix: running `install --system` again hides it.
//! - `--user` needs no root: the same pieces under PREFIX (default `~/.local`), a vendors folder
//!   of the user naming only cloister, and `OCL_ICD_VENDORS` set to it for the user's sessions
//!   (`~/.config/environment.d/cloister.conf` for systemd sessions, a marked block in
//!   `~/.profile` for login shells). The drivers stay where they are; cloister reads them there.
//!
//! Both install a systemd user unit for `cloister broker` (applications find the per-user broker;
//! without it each starts a private one) and write a manifest of everything written, created,
//! moved or enabled, which `uninstall` undoes in reverse.

use std::io::Write;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};

use serde::{Deserialize, Serialize};

use crate::cage::Install;
use crate::drivers;

/// The reviewed unit file; `@CLOISTER@` is the installed binary.
const UNIT: &str = include_str!("../data/cloister-broker.service");
const UNIT_NAME: &str = "cloister-broker.service";
const PROFILE_BEGIN: &str = "# >>> cloister install --user (removed by `cloister uninstall`) >>>";
const PROFILE_END: &str = "# <<< cloister install --user <<<";

#[derive(clap::Args)]
#[command(group(clap::ArgGroup::new("scope").args(["system", "user"]).required(true)))]
pub struct InstallArgs {
    /// For every user of the machine (as root): PREFIX defaults to /usr/local, and the drivers'
    /// own .icd files are moved out of /etc/OpenCL/vendors into /etc/cloister/vendors.
    #[arg(long)]
    system: bool,
    /// For this user only, no root needed: PREFIX defaults to ~/.local, and OCL_ICD_VENDORS is
    /// set for the user's sessions to a folder that names only cloister.
    #[arg(long)]
    user: bool,
    /// Install cloister as PREFIX/bin/cloister and its shim and worker in PREFIX/lib/cloister/.
    #[arg(long)]
    prefix: Option<PathBuf>,
}

#[derive(clap::Args)]
pub struct UninstallArgs {
    /// Undo `cloister install --system` (the default as root when it was done).
    #[arg(long, conflicts_with = "user")]
    system: bool,
    /// Undo `cloister install --user` (the default otherwise).
    #[arg(long)]
    user: bool,
}

/// What an install did, so that uninstall undoes exactly that. Kept across reinstalls.
#[derive(Serialize, Deserialize, Default)]
struct Manifest {
    scope: String,
    prefix: PathBuf,
    /// Files (and links) written, removed by uninstall.
    files: Vec<PathBuf>,
    /// Folders created, in creation order; uninstall removes them, deepest first, when empty.
    dirs: Vec<PathBuf>,
    /// Driver `.icd` files moved out of the loaders' sight.
    hidden: Vec<Hidden>,
    /// The block appended to a shell profile.
    profile: Option<ProfileBlock>,
    /// How the unit was enabled: `systemctl ARGS enable`.
    enabled: Option<Vec<String>>,
}

#[derive(Serialize, Deserialize, Clone)]
struct Hidden {
    from: PathBuf,
    to: PathBuf,
    /// Moved by `dpkg-divert --rename` (the file belongs to a package), not by a rename.
    diverted: bool,
}

#[derive(Serialize, Deserialize)]
struct ProfileBlock {
    path: PathBuf,
    text: String,
    /// The file did not exist before.
    created: bool,
    /// A newline was added before the block (the file did not end with one).
    #[serde(default)]
    newline_before: bool,
}

/// Where one kind of install puts things.
struct Layout {
    system: bool,
    prefix: PathBuf,
    manifest: PathBuf,
    /// The folder where `cloister.icd` goes.
    icd_dir: PathBuf,
    unit: PathBuf,
    /// `systemctl` arguments that enable a unit there.
    systemctl: Vec<String>,
    /// Only for --user: the environment.d file and the shell profile.
    env_file: Option<PathBuf>,
    profile: Option<PathBuf>,
}

impl Layout {
    fn new(system: bool, prefix: Option<PathBuf>) -> Result<Self, String> {
        if system {
            return Ok(Self {
                system,
                prefix: prefix.unwrap_or_else(|| PathBuf::from("/usr/local")),
                manifest: PathBuf::from("/var/lib/cloister/install.json"),
                icd_dir: PathBuf::from(drivers::DEFAULT_VENDORS_DIR),
                unit: Path::new("/etc/systemd/user").join(UNIT_NAME),
                systemctl: vec!["--global".into()],
                env_file: None,
                profile: None,
            });
        }
        let home = cloister_ipc::private::home_dir().ok_or("no home folder (set HOME)")?;
        let xdg = |var: &str, default: &str| {
            std::env::var_os(var)
                .filter(|v| Path::new(v).is_absolute())
                .map(PathBuf::from)
                .unwrap_or(home.join(default))
        };
        let (data, config) = (xdg("XDG_DATA_HOME", ".local/share"), xdg("XDG_CONFIG_HOME", ".config"));
        Ok(Self {
            system,
            prefix: prefix.unwrap_or_else(|| home.join(".local")),
            manifest: data.join("cloister/install.json"),
            icd_dir: data.join("cloister/vendors"),
            unit: config.join("systemd/user").join(UNIT_NAME),
            systemctl: vec!["--user".into()],
            env_file: Some(config.join("environment.d/cloister.conf")),
            profile: Some(home.join(".profile")),
        })
    }

    fn scope(&self) -> &'static str {
        if self.system {
            "system"
        } else {
            "user"
        }
    }

    fn lib(&self) -> PathBuf {
        self.prefix.join("lib/cloister")
    }
}

pub fn install(args: &InstallArgs) -> Result<ExitCode, String> {
    let prefix = args.prefix.as_ref().map(|p| std::path::absolute(p).map_err(|e| format!("{}: {e}", p.display())));
    let layout = Layout::new(args.system, prefix.transpose()?)?;
    if layout.system && cloister_ipc::private::euid() != 0 {
        return Err("`cloister install --system` changes /etc and PREFIX: run it as root (sudo), or use --user".into());
    }
    let pieces = Install::locate()?;
    let mut m = match read_manifest(&layout.manifest)? {
        Some(m) if m.prefix != layout.prefix => {
            return Err(format!(
                "cloister is installed in {} already ({}): `cloister uninstall --{}` first",
                m.prefix.display(),
                layout.manifest.display(),
                layout.scope()
            ))
        }
        Some(m) => m,
        None => Manifest { scope: layout.scope().into(), prefix: layout.prefix.clone(), ..Manifest::default() },
    };
    // The manifest is written whatever happens, so that a failed install can be undone too; it
    // lists itself (and its folder) among what uninstall removes.
    let done = install_steps(&layout, &pieces, &mut m);
    let saved = mkdirs(layout.manifest.parent().ok_or("a manifest path without a folder")?, &mut m).and_then(|()| {
        record(&layout.manifest, &mut m);
        let text = serde_json::to_string_pretty(&m).map_err(|e| e.to_string())?;
        write_file(&layout.manifest, text.as_bytes(), 0o644, &mut m)
    });
    done?;
    saved?;
    println!(
        "manifest of what was done: {} (`cloister uninstall --{}` undoes it)",
        layout.manifest.display(),
        layout.scope()
    );
    Ok(ExitCode::SUCCESS)
}

fn install_steps(layout: &Layout, pieces: &Install, m: &mut Manifest) -> Result<(), String> {
    // The pieces.
    let exe = std::env::current_exe().map_err(|e| format!("cannot find own binary: {e}"))?;
    let (bin, lib) = (layout.prefix.join("bin/cloister"), layout.lib());
    copy(&exe, &bin, 0o755, m)?;
    copy(&pieces.shim, &lib.join("libcloister.so"), 0o644, m)?;
    copy(&pieces.worker, &lib.join("cloister-worker"), 0o755, m)?;
    // `cloister bench`'s client, looked for beside the worker: from the workspace build or
    // beside the binary (`cargo install` puts it there).
    let beside = |p: &Path| p.with_file_name("cloister-bench-client");
    if let Some(bench) = [beside(&pieces.worker), beside(&exe)].into_iter().find(|p| p.exists()) {
        copy(&bench, &lib.join("cloister-bench-client"), 0o755, m)?;
    }
    // The shim starts a private broker with the `cloister` beside it (shim/src/runtime.rs).
    link(Path::new("../../bin/cloister"), &lib.join("cloister"), m)?;
    println!("installed {} and its shim and worker in {}", bin.display(), lib.display());

    // The drivers out of the loaders' sight, then cloister in.
    let shim = lib.join("libcloister.so");
    if layout.system {
        hide_drivers(&shim, m)?;
    }
    write_file(&layout.icd_dir.join("cloister.icd"), format!("{}\n", shim.display()).as_bytes(), 0o644, m)?;
    println!("registered {} in {}", shim.display(), layout.icd_dir.display());
    if let (Some(env_file), Some(profile)) = (&layout.env_file, &layout.profile) {
        let vendors = layout.icd_dir.display();
        write_file(env_file, format!("OCL_ICD_VENDORS={vendors}\n").as_bytes(), 0o644, m)?;
        add_profile_block(profile, &format!("export OCL_ICD_VENDORS=\"{vendors}\""), m)?;
        println!(
            "OCL_ICD_VENDORS={vendors} for your sessions: {} (systemd) and {}; log in again, or `export OCL_ICD_VENDORS={vendors}` now",
            env_file.display(),
            profile.display()
        );
    }

    // The broker's unit.
    write_file(&layout.unit, UNIT.replace("@CLOISTER@", &bin.to_string_lossy()).as_bytes(), 0o644, m)?;
    enable_unit(layout, m);
    Ok(())
}

/// Moves every driver `.icd` of the system registry (not cloister's) to the hidden registry.
fn hide_drivers(shim: &Path, m: &mut Manifest) -> Result<(), String> {
    let registry = Path::new(drivers::DEFAULT_VENDORS_DIR);
    let hidden_dir = Path::new(drivers::HIDDEN_VENDORS_DIR);
    for d in drivers::discover(registry, shim) {
        let from = registry.join(format!("{}.icd", d.name));
        let to = hidden_dir.join(format!("{}.icd", d.name));
        if !from.is_file() {
            continue;
        }
        mkdirs(hidden_dir, m)?;
        if let Some(h) = m.hidden.iter().find(|h| h.from == from) {
            // Hidden before and put back since (a package upgrade without the diversion, a
            // script): the newer file replaces the hidden one, where cloister reads it.
            std::fs::rename(&from, &h.to)
                .map_err(|e| format!("cannot move {} to {}: {e}", from.display(), h.to.display()))?;
            println!("hid {} again (it had come back) in {}", from.display(), h.to.display());
            continue;
        }
        let diverted = owned_by_package(&from);
        if diverted {
            let out = Command::new("dpkg-divert")
                .args(["--local", "--add", "--rename", "--divert"])
                .arg(&to)
                .arg(&from)
                .output()
                .map_err(|e| format!("cannot run dpkg-divert: {e}"))?;
            if !out.status.success() {
                return Err(format!(
                    "dpkg-divert of {} failed: {}",
                    from.display(),
                    String::from_utf8_lossy(&out.stderr).trim()
                ));
            }
        } else {
            if to.exists() {
                return Err(format!("{} exists already: not moving {} over it", to.display(), from.display()));
            }
            std::fs::rename(&from, &to)
                .map_err(|e| format!("cannot move {} to {}: {e}", from.display(), to.display()))?;
        }
        println!(
            "hid driver {} from applications: {} -> {}{}",
            d.name,
            from.display(),
            to.display(),
            if diverted { " (dpkg-divert: its package's upgrades write there)" } else { "" }
        );
        m.hidden.push(Hidden { from, to, diverted });
    }
    Ok(())
}

/// Whether a Debian package owns `path` (so `dpkg-divert` is the way to move it for good).
fn owned_by_package(path: &Path) -> bool {
    Command::new("dpkg-query")
        .arg("-S")
        .arg(path)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// Enables the unit with `systemctl` when it can (which works without a running manager: it
/// only makes the link), and for --user starts it now if a user manager is reachable; says how
/// otherwise.
fn enable_unit(layout: &Layout, m: &mut Manifest) {
    let systemctl = |verb: &str| {
        let mut args = layout.systemctl.clone();
        args.extend([verb.to_string(), UNIT_NAME.to_string()]);
        let shown = format!("systemctl {}", args.join(" "));
        match Command::new("systemctl").args(&args).output() {
            Ok(o) if o.status.success() => Ok(shown),
            Ok(o) => Err(format!("`{shown}`: {}", String::from_utf8_lossy(&o.stderr).trim())),
            Err(e) => Err(format!("`{shown}`: {e}")),
        }
    };
    // systemctl makes the folder of the unit's WantedBy link when missing; its disable leaves
    // it: recorded as ours.
    let wants = layout.unit.with_file_name("default.target.wants");
    let wants_existed = wants.exists();
    match systemctl("enable") {
        Ok(shown) => {
            m.enabled = Some(layout.systemctl.clone());
            if !wants_existed && wants.exists() && !m.dirs.contains(&wants) {
                m.dirs.push(wants);
            }
            println!("enabled the broker's unit {} ({shown}): it starts with each user session", layout.unit.display());
        }
        Err(e) => {
            println!(
                "installed the broker's unit {} but could not enable it ({e}); meanwhile each application \
                 starts a private broker, which works the same",
                layout.unit.display()
            );
            return;
        }
    }
    if !layout.system {
        match systemctl("start") {
            Ok(shown) => println!("started the broker ({shown})"),
            Err(e) => println!("the broker starts at your next login (not now: {e})"),
        }
    }
}

pub fn uninstall(args: &UninstallArgs) -> Result<ExitCode, String> {
    let root = cloister_ipc::private::euid() == 0;
    let system = args.system || (!args.user && root && Layout::new(true, None).is_ok_and(|l| l.manifest.exists()));
    if system && !root {
        return Err("`cloister uninstall --system` changes /etc and PREFIX: run it as root (sudo)".into());
    }
    let layout = Layout::new(system, None)?;
    let m = read_manifest(&layout.manifest)?.ok_or_else(|| {
        format!("no {} install of cloister to undo ({} does not exist)", layout.scope(), layout.manifest.display())
    })?;
    let mut problems = Vec::new();
    if let Some(scope) = &m.enabled {
        let out = Command::new("systemctl").args(scope).args(["disable", UNIT_NAME]).output();
        if !out.as_ref().is_ok_and(|o| o.status.success()) {
            problems.push(format!("systemctl {} disable {UNIT_NAME} failed", scope.join(" ")));
        }
        if !system {
            let _ = Command::new("systemctl").args(["--user", "stop", UNIT_NAME]).output();
        }
    }
    if let Some(p) = &m.profile {
        if let Err(e) = remove_profile_block(p) {
            problems.push(e);
        }
    }
    for f in m.files.iter().rev().filter(|f| **f != layout.manifest) {
        match std::fs::remove_file(f) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => problems.push(format!("cannot remove {}: {e}", f.display())),
        }
    }
    for h in m.hidden.iter().rev() {
        if let Err(e) = unhide(h) {
            problems.push(e);
        }
    }
    if !problems.is_empty() {
        // The manifest stays, for another try once they are mended.
        return Err(format!("uninstall left things behind:\n  {}", problems.join("\n  ")));
    }
    std::fs::remove_file(&layout.manifest).map_err(|e| format!("cannot remove {}: {e}", layout.manifest.display()))?;
    for d in m.dirs.iter().rev() {
        // Only when empty: anything else there is not ours to remove.
        let _ = std::fs::remove_dir(d);
    }
    println!("removed the {} install of cloister ({})", layout.scope(), m.prefix.display());
    Ok(ExitCode::SUCCESS)
}

/// Puts a hidden driver's `.icd` back where it was.
fn unhide(h: &Hidden) -> Result<(), String> {
    if h.from.exists() {
        // Put back meanwhile (and newer): the hidden copy goes.
        if h.diverted {
            let _ = Command::new("dpkg-divert").args(["--local", "--remove", "--no-rename"]).arg(&h.from).output();
        }
        return std::fs::remove_file(&h.to).map_err(|e| format!("cannot remove {}: {e}", h.to.display()));
    }
    if h.diverted {
        let out = Command::new("dpkg-divert")
            .args(["--local", "--remove", "--rename", "--divert"])
            .arg(&h.to)
            .arg(&h.from)
            .output()
            .map_err(|e| format!("cannot run dpkg-divert: {e}"))?;
        if !out.status.success() {
            return Err(format!(
                "dpkg-divert --remove of {} failed: {}",
                h.from.display(),
                String::from_utf8_lossy(&out.stderr).trim()
            ));
        }
        return Ok(());
    }
    std::fs::rename(&h.to, &h.from)
        .map_err(|e| format!("cannot move {} back to {}: {e}", h.to.display(), h.from.display()))
}

fn read_manifest(path: &Path) -> Result<Option<Manifest>, String> {
    match std::fs::read(path) {
        Ok(bytes) => serde_json::from_slice(&bytes)
            .map(Some)
            .map_err(|e| format!("{} is not a cloister install manifest: {e}", path.display())),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(format!("cannot read {}: {e}", path.display())),
    }
}

/// Creates `dir` and its missing parents, recording each one created.
fn mkdirs(dir: &Path, m: &mut Manifest) -> Result<(), String> {
    if dir.is_dir() {
        return Ok(());
    }
    if let Some(parent) = dir.parent() {
        mkdirs(parent, m)?;
    }
    std::fs::create_dir(dir).map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
    if !m.dirs.contains(&dir.to_path_buf()) {
        m.dirs.push(dir.to_path_buf());
    }
    Ok(())
}

fn record(path: &Path, m: &mut Manifest) {
    if !m.files.iter().any(|f| f == path) {
        m.files.push(path.to_path_buf());
    }
}

/// Writes `bytes` to `path` through a temporary file and a rename: a running `cloister` or an
/// application with the old shim loaded keeps its file, the next start gets the new one.
fn write_file(path: &Path, bytes: &[u8], mode: u32, m: &mut Manifest) -> Result<(), String> {
    mkdirs(path.parent().ok_or("a path without a folder")?, m)?;
    let tmp = path.with_file_name(format!(".{}.cloister-tmp", path.file_name().unwrap_or_default().to_string_lossy()));
    replace_file(path, &tmp, bytes, mode).map_err(|e| format!("cannot write {}: {e}", path.display()))?;
    record(path, m);
    Ok(())
}

/// Writes `bytes` to `path` with exactly `mode` (whatever the umask), through `tmp` and a
/// rename, so a reader sees the old file or the new one, never half of one; a failure (a full
/// disk) leaves no `tmp` behind.
pub(crate) fn replace_file(path: &Path, tmp: &Path, bytes: &[u8], mode: u32) -> std::io::Result<()> {
    let written = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(mode)
        .open(tmp)
        .and_then(|mut f| {
            f.write_all(bytes)?;
            f.set_permissions(std::fs::Permissions::from_mode(mode))?;
            f.sync_all()
        })
        .and_then(|()| std::fs::rename(tmp, path));
    if written.is_err() {
        let _ = std::fs::remove_file(tmp);
    }
    written
}

fn copy(from: &Path, to: &Path, mode: u32, m: &mut Manifest) -> Result<(), String> {
    let bytes = std::fs::read(from).map_err(|e| format!("cannot read {}: {e}", from.display()))?;
    write_file(to, &bytes, mode, m)
}

fn link(target: &Path, path: &Path, m: &mut Manifest) -> Result<(), String> {
    mkdirs(path.parent().ok_or("a path without a folder")?, m)?;
    if std::fs::read_link(path).ok().as_deref() != Some(target) {
        let _ = std::fs::remove_file(path);
        std::os::unix::fs::symlink(target, path).map_err(|e| format!("cannot link {}: {e}", path.display()))?;
    }
    record(path, m);
    Ok(())
}

/// Appends the marked block to the shell profile (once), recording exactly what was added.
fn add_profile_block(path: &Path, line: &str, m: &mut Manifest) -> Result<(), String> {
    if m.profile.is_some() {
        return Ok(());
    }
    let old = match std::fs::read_to_string(path) {
        Ok(t) => Some(t),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
        Err(e) => return Err(format!("cannot read {}: {e}", path.display())),
    };
    let before = old.as_deref().unwrap_or("");
    let newline_before = !before.is_empty() && !before.ends_with('\n');
    let text = format!("{PROFILE_BEGIN}\n{line}\n{PROFILE_END}\n");
    let mut f = std::fs::OpenOptions::new()
        .append(true)
        .create(true)
        .mode(0o644)
        .open(path)
        .map_err(|e| format!("cannot open {}: {e}", path.display()))?;
    let sep = if newline_before { "\n" } else { "" };
    f.write_all(format!("{sep}{text}").as_bytes()).map_err(|e| format!("cannot write {}: {e}", path.display()))?;
    m.profile = Some(ProfileBlock { path: path.to_path_buf(), text, created: old.is_none(), newline_before });
    Ok(())
}

/// Removes exactly the block `add_profile_block` appended (wherever it now is in the file).
fn remove_profile_block(p: &ProfileBlock) -> Result<(), String> {
    let now = match std::fs::read_to_string(&p.path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(format!("cannot read {}: {e}", p.path.display())),
    };
    let Some(at) = now.rfind(&p.text) else {
        return Err(format!("the block cloister added to {} was changed: remove it by hand", p.path.display()));
    };
    let (head, tail) = (&now[..at], &now[at + p.text.len()..]);
    // The newline added before the block goes too when nothing was written after it since;
    // otherwise it now ends the line that was last, and stays.
    let head = match p.newline_before && tail.is_empty() {
        true => head.strip_suffix('\n').unwrap_or(head),
        false => head,
    };
    let rest = format!("{head}{tail}");
    if rest.is_empty() && p.created {
        return std::fs::remove_file(&p.path).map_err(|e| format!("cannot remove {}: {e}", p.path.display()));
    }
    std::fs::write(&p.path, rest).map_err(|e| format!("cannot write {}: {e}", p.path.display()))
}

/// Says once per process when a driver's `.icd` is back in the system registry beside
/// cloister's (a package upgrade or a new driver): applications then list it twice, once not
/// caged.
pub fn warn_visible_drivers(shim: &Path) {
    static SAID: std::sync::Once = std::sync::Once::new();
    let visible = drivers::visible_beside_cloister(shim);
    if visible.is_empty() || std::env::var_os("CLOISTER_QUIET").is_some() {
        return;
    }
    SAID.call_once(|| {
        eprintln!(
            "cloister: warning: {} in {} beside cloister.icd (a driver package upgrade or install put it there?): \
             applications see it twice, once not caged; `sudo cloister install --system` hides it again",
            visible.iter().map(|n| format!("{n}.icd")).collect::<Vec<_>>().join(", "),
            drivers::DEFAULT_VENDORS_DIR
        )
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_profile_block_comes_out_exactly_as_it_went_in() {
        let dir = cloister_ipc::private::fresh_dir(&std::env::temp_dir(), "cloister-profile-test-").unwrap();
        // A profile without a final newline, changed after the install (a line added below):
        // the user's lines stay whole.
        let profile = dir.join(".profile");
        std::fs::write(&profile, "export A=1").unwrap();
        let mut m = Manifest::default();
        add_profile_block(&profile, "export OCL_ICD_VENDORS=\"/x\"", &mut m).unwrap();
        add_profile_block(&profile, "export OCL_ICD_VENDORS=\"/x\"", &mut m).unwrap();
        let installed = std::fs::read_to_string(&profile).unwrap();
        assert_eq!(installed.matches(PROFILE_BEGIN).count(), 1, "{installed}");
        std::fs::write(&profile, format!("{installed}export B=2\n")).unwrap();
        remove_profile_block(m.profile.as_ref().unwrap()).unwrap();
        assert_eq!(std::fs::read_to_string(&profile).unwrap(), "export A=1\nexport B=2\n");
        // Unchanged since: byte for byte as before.
        std::fs::write(&profile, "export A=1").unwrap();
        let mut m = Manifest::default();
        add_profile_block(&profile, "export OCL_ICD_VENDORS=\"/x\"", &mut m).unwrap();
        remove_profile_block(m.profile.as_ref().unwrap()).unwrap();
        assert_eq!(std::fs::read_to_string(&profile).unwrap(), "export A=1");
        // A profile the install created goes again.
        let created = dir.join("created");
        let mut m = Manifest::default();
        add_profile_block(&created, "export X=1", &mut m).unwrap();
        remove_profile_block(m.profile.as_ref().unwrap()).unwrap();
        assert!(!created.exists());
        // A block edited by hand is left alone, with a message.
        let mut m = Manifest::default();
        add_profile_block(&created, "export X=1", &mut m).unwrap();
        std::fs::write(&created, "edited").unwrap();
        assert!(remove_profile_block(m.profile.as_ref().unwrap()).unwrap_err().contains("remove it by hand"));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
