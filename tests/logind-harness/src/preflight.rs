//! Finds the programs the harness runs, and says exactly what to install when one is missing.
//!
//! A test that needs logind must fail loudly on a machine without it, never pass by doing nothing,
//! so `LogindHarness::start` runs this first and returns [`Error::MissingPrerequisites`].

use std::path::{Path, PathBuf};
use std::process::Stdio;

use crate::{Error, Mode, Result};

/// Where Debian's `systemd` package puts logind (`/lib` is a symlink to `/usr/lib` on merged-/usr
/// systems, so this path works on both layouts).
pub const LOGIND_PATH: &str = "/lib/systemd/systemd-logind";

/// The Python that has Debian's `python3-dbusmock` (and its `python3-dbus`/`python3-gi`) on its
/// path. A `python3` found on `PATH` may be a pyenv or venv interpreter without the Debian
/// modules, so the harness never uses it.
pub const SYSTEM_PYTHON: &str = "/usr/bin/python3";

/// Directories searched after `PATH`, so the harness works from a test runner with a minimal
/// `PATH` (root's `sbin` directories are often missing from it).
const FALLBACK_DIRS: &[&str] = &["/usr/sbin", "/usr/bin", "/sbin", "/bin"];

/// Paths of the programs the harness runs, as found by [`preflight`].
#[derive(Debug, Clone)]
pub struct Tools {
    /// `dbus-daemon` (package `dbus`).
    pub dbus_daemon: PathBuf,
    /// `/usr/bin/python3` with `dbusmock` importable (package `python3-dbusmock`).
    pub python: PathBuf,
    /// `unshare` (package `util-linux`); `None` in [`Mode::DbusmockLogind`].
    pub unshare: Option<PathBuf>,
    /// `systemd-logind` (package `systemd`); `None` in [`Mode::DbusmockLogind`].
    pub logind: Option<PathBuf>,
}

/// Checks that everything `mode` needs is installed (and, for [`Mode::Real`], that we are root).
///
/// # Errors
///
/// [`Error::MissingPrerequisites`] listing every missing program and the `apt-get install` line,
/// or [`Error::NotRoot`].
pub async fn preflight(mode: Mode) -> Result<Tools> {
    let python = PathBuf::from(SYSTEM_PYTHON);
    let python = if !is_executable(&python) {
        Python::Missing
    } else if dbusmock_importable(&python).await {
        Python::Ready(python)
    } else {
        Python::NoDbusmock
    };
    let logind = PathBuf::from(LOGIND_PATH);
    let found = Found {
        dbus_daemon: find_program("dbus-daemon"),
        python,
        unshare: find_program("unshare"),
        mount: find_program("mount"),
        logind: is_executable(&logind).then_some(logind),
        etc_systemd: Path::new("/etc/systemd").is_dir(),
    };
    let tools = assess(mode, found)?;
    if mode == Mode::Real {
        let euid = nix::unistd::geteuid();
        if !euid.is_root() {
            return Err(Error::NotRoot {
                euid: euid.as_raw(),
            });
        }
    }
    Ok(tools)
}

/// What [`preflight`] found on the machine.
#[derive(Debug, Clone, Default)]
struct Found {
    dbus_daemon: Option<PathBuf>,
    python: Python,
    unshare: Option<PathBuf>,
    mount: Option<PathBuf>,
    logind: Option<PathBuf>,
    etc_systemd: bool,
}

/// State of the system Python.
#[derive(Debug, Clone, Default)]
enum Python {
    /// `/usr/bin/python3` does not exist.
    #[default]
    Missing,
    /// It exists but cannot `import dbusmock, dbus, gi`.
    NoDbusmock,
    /// It can import dbusmock.
    Ready(PathBuf),
}

/// Decides from what was found whether `mode` can run, and if not, what to install.
fn assess(mode: Mode, found: Found) -> Result<Tools> {
    let mut missing = Vec::new();
    let mut packages: Vec<&str> = Vec::new();
    let mut need = |what: String, package: &'static str| {
        missing.push(what);
        if !packages.contains(&package) {
            packages.push(package);
        }
    };

    if found.dbus_daemon.is_none() {
        need("dbus-daemon not found on PATH".into(), "dbus");
    }
    let python = match found.python {
        Python::Ready(p) => Some(p),
        Python::Missing => {
            need(format!("{SYSTEM_PYTHON} not found"), "python3-dbusmock");
            None
        }
        Python::NoDbusmock => {
            need(
                format!("`{SYSTEM_PYTHON} -c \"import dbusmock\"` fails"),
                "python3-dbusmock",
            );
            None
        }
    };
    if mode == Mode::Real {
        if found.unshare.is_none() {
            need("unshare not found on PATH".into(), "util-linux");
        }
        if found.mount.is_none() {
            need("mount not found on PATH".into(), "mount");
        }
        if found.logind.is_none() {
            need(format!("{LOGIND_PATH} not found"), "systemd");
        }
        if !found.etc_systemd {
            need(
                "/etc/systemd does not exist (the harness bind-mounts over it)".into(),
                "systemd",
            );
        }
    }
    match (found.dbus_daemon, python) {
        (Some(dbus_daemon), Some(python)) if missing.is_empty() => Ok(Tools {
            dbus_daemon,
            python,
            unshare: found.unshare.filter(|_| mode == Mode::Real),
            logind: found.logind.filter(|_| mode == Mode::Real),
        }),
        _ => Err(Error::MissingPrerequisites {
            missing,
            packages: packages.into_iter().map(String::from).collect(),
        }),
    }
}

async fn dbusmock_importable(python: &Path) -> bool {
    tokio::process::Command::new(python)
        .args(["-c", "import dbusmock, dbus, gi"])
        .env_remove("PYTHONPATH")
        .env_remove("PYTHONHOME")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .await
        .map(|s| s.success())
        .unwrap_or(false)
}

fn find_program(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .chain(FALLBACK_DIRS.iter().map(PathBuf::from))
        .map(|dir| dir.join(name))
        .find(|p| is_executable(p))
}

fn is_executable(p: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(p).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn missing_prerequisites_message_names_packages_and_command() {
        let e = Error::MissingPrerequisites {
            missing: vec!["dbus-daemon not found on PATH".into()],
            packages: vec!["dbus".into()],
        };
        let msg = e.to_string();
        assert!(msg.contains("dbus-daemon not found"), "{msg}");
        assert!(msg.contains("apt-get install -y dbus "), "{msg}");
        assert!(
            msg.contains("systemd dbus python3-dbusmock util-linux"),
            "{msg}"
        );
    }

    fn everything() -> Found {
        Found {
            dbus_daemon: Some("/usr/bin/dbus-daemon".into()),
            python: Python::Ready(SYSTEM_PYTHON.into()),
            unshare: Some("/usr/bin/unshare".into()),
            mount: Some("/usr/bin/mount".into()),
            logind: Some(LOGIND_PATH.into()),
            etc_systemd: true,
        }
    }

    fn packages(mode: Mode, found: Found) -> Vec<String> {
        match assess(mode, found) {
            Ok(_) => Vec::new(),
            Err(Error::MissingPrerequisites { packages, .. }) => packages,
            Err(e) => panic!("unexpected {e}"),
        }
    }

    #[test]
    fn each_missing_piece_names_its_package() {
        let cases: Vec<(Mode, Found, &[&str])> = vec![
            (Mode::Real, everything(), &[]),
            (
                Mode::Real,
                Found {
                    logind: None,
                    ..everything()
                },
                &["systemd"],
            ),
            (
                Mode::Real,
                Found {
                    dbus_daemon: None,
                    ..everything()
                },
                &["dbus"],
            ),
            (
                Mode::Real,
                Found {
                    python: Python::NoDbusmock,
                    ..everything()
                },
                &["python3-dbusmock"],
            ),
            (
                Mode::Real,
                Found {
                    python: Python::Missing,
                    ..everything()
                },
                &["python3-dbusmock"],
            ),
            (
                Mode::Real,
                Found {
                    unshare: None,
                    ..everything()
                },
                &["util-linux"],
            ),
            (
                Mode::Real,
                Found {
                    mount: None,
                    ..everything()
                },
                &["mount"],
            ),
            (
                Mode::Real,
                Found::default(),
                &["dbus", "python3-dbusmock", "util-linux", "mount", "systemd"],
            ),
            // The dbusmock mode needs neither logind nor unshare.
            (
                Mode::DbusmockLogind,
                Found {
                    logind: None,
                    unshare: None,
                    ..everything()
                },
                &[],
            ),
            (
                Mode::DbusmockLogind,
                Found::default(),
                &["dbus", "python3-dbusmock"],
            ),
        ];
        for (mode, found, want) in cases {
            let desc = format!("{mode:?} {found:?}");
            assert_eq!(packages(mode, found), want, "{desc}");
        }
    }

    #[test]
    fn the_error_says_what_to_run() {
        let err = assess(
            Mode::Real,
            Found {
                logind: None,
                ..everything()
            },
        )
        .err()
        .map(|e| e.to_string())
        .unwrap_or_default();
        assert!(
            err.contains("/lib/systemd/systemd-logind not found"),
            "{err}"
        );
        assert!(err.contains("apt-get install -y systemd "), "{err}");
    }

    #[test]
    fn finds_sh_through_path_or_fallback() {
        assert!(find_program("sh").is_some());
        assert!(find_program("surely-not-a-program-logind-harness").is_none());
    }
}
