//! The landlock layer: read-only access to what the profile lists, read-write only to the
//! worker's private cache (and the profile's `write` list), execution only of the profile's
//! `execute` list. Paths that do not exist on this machine are skipped.

use std::path::Path;

use landlock::{Access, AccessFs, PathBeneath, PathFd, Ruleset, RulesetAttr, RulesetCreatedAttr, RulesetStatus, ABI};

use crate::profile::Profile;
use crate::{LayerState, SandboxError};

fn add(
    ruleset: landlock::RulesetCreated,
    path: &str,
    access: landlock::BitFlags<AccessFs>,
) -> Result<landlock::RulesetCreated, SandboxError> {
    let Ok(fd) = PathFd::new(path) else {
        return Ok(ruleset);
    };
    // Files take only file rights; directories take them all.
    let access = if Path::new(path).is_dir() { access } else { access & AccessFs::from_file(ABI) };
    ruleset.add_rule(PathBeneath::new(fd, access)).map_err(|e| SandboxError::Landlock(e.to_string()))
}

/// Confines the calling process (and its future threads and children).
/// The newest landlock ABI we use: V2 adds `Refer` (without it, landlock refuses every rename
/// across directories, and pocl renames finished kernels into its cache), V3 `Truncate`, V5
/// device ioctls. On older kernels the crate degrades to what the kernel has.
const ABI: ABI = ABI::V5;

pub fn apply(profile: &Profile, private_dirs: &[&Path], extra_read: &[&Path]) -> Result<LayerState, SandboxError> {
    let abi = ABI;
    let read = AccessFs::from_read(abi) & !AccessFs::Execute;
    let exec = AccessFs::from_read(abi);
    let write = AccessFs::from_all(abi) & !AccessFs::Execute;
    let mut ruleset = Ruleset::default()
        .handle_access(AccessFs::from_all(abi))
        .map_err(|e| SandboxError::Landlock(e.to_string()))?
        .create()
        .map_err(|e| SandboxError::Landlock(e.to_string()))?;
    for p in &profile.filesystem.read {
        ruleset = add(ruleset, p, read)?;
    }
    for p in extra_read.iter().filter_map(|p| p.to_str()) {
        ruleset = add(ruleset, p, read)?;
    }
    for p in &profile.filesystem.execute {
        ruleset = add(ruleset, p, exec)?;
    }
    for p in &profile.filesystem.write {
        ruleset = add(ruleset, p, write | read)?;
    }
    for d in private_dirs {
        if let Some(s) = d.to_str() {
            ruleset = add(ruleset, s, write | read)?;
        }
    }
    let status = ruleset.restrict_self().map_err(|e| SandboxError::Landlock(e.to_string()))?;
    Ok(match status.ruleset {
        RulesetStatus::FullyEnforced => LayerState::On,
        RulesetStatus::PartiallyEnforced => LayerState::On, // an older ABI: still confining
        RulesetStatus::NotEnforced => LayerState::Off("the kernel does not enforce landlock".into()),
    })
}
