//! `cloister config`: the value in effect of every setting and where it came from (flag,
//! environment, which file and line, default), for every driver too; `--check FILE` checks a
//! file without running anything; `--markdown` prints the README's settings table.

use std::path::PathBuf;
use std::process::ExitCode;

use cloister_ipc::config::{self, Source, SETTINGS};
use cloister_ipc::settings;

use crate::cage::SandboxOptions;

#[derive(clap::Args)]
pub struct ConfigArgs {
    /// Check this configuration file (syntax, keys, values, the profiles it names) and exit:
    /// status 1 and `FILE:LINE: reason` if it is wrong.
    #[arg(long, value_name = "FILE", conflicts_with = "markdown")]
    check: Option<PathBuf>,
    /// Print the settings table (Markdown, as in the README).
    #[arg(long)]
    markdown: bool,
    /// Show only this driver's section (an .icd name or a library path).
    #[arg(long)]
    driver: Option<String>,
    #[command(flatten)]
    sandbox: SandboxOptions,
}

pub fn run(args: ConfigArgs) -> Result<ExitCode, String> {
    if args.markdown {
        print!("{}", config::markdown_table());
        return Ok(ExitCode::SUCCESS);
    }
    if let Some(path) = &args.check {
        return Ok(check(path));
    }
    args.sandbox.resolve()?;
    let files = settings::files();
    for (whose, path) in [("user", config::user_file()), ("system", Some(config::system_file()))] {
        let Some(path) = path else {
            println!("{whose} file: none (no HOME)");
            continue;
        };
        let state = if files.files.iter().any(|f| f.path == path) {
            "used"
        } else if files.warnings.iter().any(|w| w.starts_with(&format!("{}:", path.display()))) {
            "not used (see above)"
        } else {
            "absent"
        };
        println!("{whose} file: {} ({state})", path.display());
    }
    println!();
    let show = |key: &str, driver: Option<&str>, indent: &str| {
        let r = settings::resolve(key, driver);
        let s = config::setting(key);
        let from = match (r.source, &r.value) {
            (Source::Env, _) => format!("environment ({})", s.env),
            (Source::Default, None) => format!("default: {}", s.unset_doc().replace('`', "")),
            (other, _) => other.to_string(),
        };
        let value = r.value.unwrap_or_else(|| "-".into());
        println!("{indent}{key:<22} {value:<26} {from}");
    };
    if args.driver.is_none() {
        println!("{:<22} {:<26} from", "setting", "value");
        for s in SETTINGS {
            show(s.key, None, "");
        }
    }
    for driver in drivers(args.driver.as_deref()) {
        println!("\n[driver.{driver}]");
        for s in SETTINGS.iter().filter(|s| s.per_driver) {
            show(s.key, Some(&driver), "  ");
        }
        for (name, value, at) in files.driver_env(&driver) {
            println!("  env {name:<18} {value:<26} {at}");
        }
        for (name, at) in files.driver_pass_env(&driver) {
            let state = if std::env::var_os(&name).is_some() { "(set here)" } else { "(unset here)" };
            println!("  pass_env {name:<13} {state:<26} {at}");
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// The drivers to show: the registered ones and those the files have a section for.
fn drivers(only: Option<&str>) -> Vec<String> {
    if let Some(d) = only {
        return vec![d.to_string()];
    }
    let shim = crate::cage::Install::locate().map(|i| i.shim).unwrap_or_default();
    let mut names: Vec<String> = crate::drivers::discover_all(&shim).into_iter().map(|d| d.name).collect();
    names.extend(settings::files().driver_names());
    names.sort();
    names.dedup();
    names
}

/// `--check FILE`: exit status 0 and one line if the file is right, 1 and `FILE:LINE: reason`.
fn check(path: &std::path::Path) -> ExitCode {
    let result = config::File::load(path).and_then(|f| {
        for (values, where_) in [(&f.values, String::new())]
            .into_iter()
            .chain(f.drivers.iter().map(|(d, s)| (&s.values, format!(" [driver.{d}]"))))
        {
            if let Some((p, line)) = values.get("profile") {
                cloister_sandbox_policy::Profile::load(p)
                    .map_err(|e| format!("{}:{line}:{where_} {e}", path.display()))?;
            }
        }
        Ok(f)
    });
    match result {
        Ok(f) => {
            println!("{}: valid ({} settings, {} driver sections)", path.display(), f.values.len(), f.drivers.len());
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("cloister: {e}");
            ExitCode::from(1)
        }
    }
}
