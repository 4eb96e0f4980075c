//! Pure text the harness writes or passes to its children: the bus configuration, the logind
//! configuration, the mount-namespace script and the Python snippets that reshape dbusmock.
//!
//! Kept apart from the process handling so every string can be checked by a unit test without
//! starting anything.

use std::fmt::Write as _;
use std::path::Path;
use std::time::Duration;

/// Unit names the systemd mock knows. logind 252 asks for `LoadState` of the unit it is about to
/// start (`poweroff.target` for `PowerOff`, `reboot.target` for `Reboot`, `halt.target` for `Halt`)
/// and refuses the call with "Unit … is not loaded" unless the mock answers `loaded`.
pub(crate) const MOCK_UNITS: &[&str] = &[
    "poweroff.target",
    "reboot.target",
    "halt.target",
    DRAIN_UNIT,
];

/// nodeward's drain unit, which the agent stops while it drains for a shutdown. The mock starts
/// it `active`, as on a node with the package installed.
pub(crate) const DRAIN_UNIT: &str = "nodeward-drain.service";

/// The D-Bus daemon configuration: a *system* bus (so sd-bus and dbus-python treat it as the system
/// bus) listening on one unix socket, with a policy that lets every local client own any name and
/// send anything. There is no `<servicedir>`, so nothing is ever bus-activated and dbus-daemon never
/// forks helpers; there is no `<pidfile>`, so nothing is written outside the harness directory.
pub(crate) fn bus_config(socket: &Path) -> String {
    format!(
        r#"<!DOCTYPE busconfig PUBLIC "-//freedesktop//DTD D-Bus Bus Configuration 1.0//EN"
 "http://www.freedesktop.org/standards/dbus/1.0/busconfig.dtd">
<!-- Written by logind-harness: a private system bus for one test. -->
<busconfig>
  <type>system</type>
  <listen>unix:path={socket}</listen>
  <auth>EXTERNAL</auth>
  <policy context="default">
    <allow user="*"/>
    <allow own="*"/>
    <allow send_type="method_call"/>
    <allow send_type="signal"/>
    <allow send_type="method_return"/>
    <allow send_type="error"/>
    <allow receive_type="method_call"/>
    <allow receive_type="signal"/>
    <allow receive_type="method_return"/>
    <allow receive_type="error"/>
  </policy>
</busconfig>
"#,
        socket = xml_escape(&socket.display().to_string()),
    )
}

fn xml_escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&apos;"),
            c => out.push(c),
        }
    }
    out
}

/// File name of the harness's own logind drop-in. `00-` sorts before anything an agent writes
/// (nodeward writes `90-nodeward.conf`), so a test's drop-in always wins, as it would over a
/// distribution's drop-in in production.
pub(crate) const HARNESS_DROPIN: &str = "00-logind-harness.conf";

/// The harness's logind drop-in.
///
/// Besides `InhibitDelayMaxSec`, it turns off everything through which logind would touch the host
/// rather than the test: VT allocation (`NAutoVTs`, `ReserveVT` — logind otherwise opens
/// `/dev/tty6`), key and lid handling (the host's power button must never power off the
/// harness's mock, nor the other way round), idle actions, and user-process/IPC clean-up.
pub(crate) fn logind_dropin(inhibit_delay_max: Duration) -> String {
    let mut s = String::from(
        "# Written by logind-harness. Drop-ins sorting after this one override it.\n[Login]\n",
    );
    // logind parses time spans with systemd's parser: a bare number is seconds, "us"/"ms" suffixes work.
    let _ = writeln!(s, "InhibitDelayMaxSec={}us", inhibit_delay_max.as_micros());
    s.push_str(
        "NAutoVTs=0\n\
         ReserveVT=0\n\
         KillUserProcesses=no\n\
         RemoveIPC=no\n\
         IdleAction=ignore\n\
         HandlePowerKey=ignore\n\
         HandleSuspendKey=ignore\n\
         HandleHibernateKey=ignore\n\
         HandleLidSwitch=ignore\n\
         HandleLidSwitchExternalPower=ignore\n\
         HandleLidSwitchDocked=ignore\n\
         HandleRebootKey=ignore\n",
    );
    s
}

/// Environment variable carrying the host directory that becomes `/run` inside logind's namespace.
pub(crate) const ENV_RUN_DIR: &str = "LOGIND_HARNESS_RUN_DIR";
/// Environment variable carrying the host directory that becomes `/etc/systemd` inside the namespace.
pub(crate) const ENV_ETC_DIR: &str = "LOGIND_HARNESS_ETC_SYSTEMD_DIR";
/// Environment variable carrying the path of the systemd-logind binary.
pub(crate) const ENV_LOGIND: &str = "LOGIND_HARNESS_LOGIND";

/// Shell script run by `unshare --mount --propagation private sh -c`. Paths come in through the
/// environment so nothing is ever interpolated into shell text.
///
/// - `/run` is a bind mount of a harness directory rather than a fresh tmpfs so that logind's state
///   (`/run/systemd/inhibit/*`, including the inhibitor FIFOs) survives a logind restart, as it does
///   on a real host; it also hides the host's `/run/nologin`, `/run/udev`, `/run/user`, utmp and the
///   journal socket from logind (logind then logs to stderr, which the harness reads).
/// - `/etc/systemd` is a bind mount of a harness directory so logind reads only the harness's
///   `logind.conf.d` and never the host's `/etc/systemd/logind.conf`; nothing is written to the
///   real `/etc`.
/// - `exec` keeps the process id: the pid of `unshare` is the pid of logind.
pub(crate) const LOGIND_NAMESPACE_SCRIPT: &str = r#"set -eu
mount --bind "$LOGIND_HARNESS_RUN_DIR" /run
mkdir -p /run/systemd
mount --bind "$LOGIND_HARNESS_ETC_SYSTEMD_DIR" /etc/systemd
exec "$LOGIND_HARNESS_LOGIND"
"#;

/// dbusmock code for systemd's `ListJobs` (`a(usssoo)`: id, unit, job type, state, job path,
/// unit path) answering `jobs`, given as (unit, job type, state).
pub(crate) fn list_jobs_code(jobs: &[(&str, &str, &str)]) -> String {
    let mut code = String::from("ret = [");
    for (i, (unit, job_type, state)) in jobs.iter().enumerate() {
        let _ = write!(
            code,
            "(dbus.UInt32({id}), '{unit}', '{job_type}', '{state}', dbus.ObjectPath('/org/freedesktop/systemd1/job/{id}'), dbus.ObjectPath('{path}')), ",
            id = i + 1,
            path = unit_object_path(unit),
        );
    }
    code.push(']');
    code
}

/// Object path dbusmock's `AddMockUnit` gives a unit (and its `GetUnit` answers): `.` and `-`
/// replaced with `_`.
pub(crate) fn dbusmock_unit_path(unit: &str) -> String {
    format!(
        "/org/freedesktop/systemd1/unit/{}",
        unit.replace(['.', '-'], "_")
    )
}

/// Object path systemd gives a unit: `bus_label_escape()` turns every byte outside `[A-Za-z0-9]`
/// (and a leading digit) into `_xx`, lowercase hex. logind computes this path itself and reads
/// `LoadState` there, whereas dbusmock's `AddMockUnit` only replaces `.` and `-` with `_`, so the
/// harness adds an object at this path too.
pub(crate) fn unit_object_path(unit: &str) -> String {
    let mut s = String::from("/org/freedesktop/systemd1/unit/");
    if unit.is_empty() {
        s.push('_');
        return s;
    }
    for (i, b) in unit.bytes().enumerate() {
        if b.is_ascii_alphabetic() || (b.is_ascii_digit() && i > 0) {
            s.push(char::from(b));
        } else {
            let _ = write!(s, "_{b:02x}");
        }
    }
    s
}

/// Replacement for the systemd template's `StartUnit`: it records a *pending* job and announces
/// it with `JobNew`, but does not send `JobRemoved`.
///
/// The stock template sends `JobRemoved` right away, and logind 252 answers a removed shutdown job
/// with `PrepareForShutdown(false)` ("you may take your locks again") — that would tell every
/// agent the shutdown was cancelled a millisecond after it started. On a real host the machine
/// goes down instead, so the harness keeps the job pending; [`FINISH_JOBS_CODE`] ends it when a
/// test asks for a cancelled shutdown.
pub(crate) const START_UNIT_CODE: &str = r#"
name = str(args[0])
job_id = self.next_job_id
self.next_job_id += 1
job_path = '/org/freedesktop/systemd1/job/%d' % job_id
objects[self.units[name]].UpdateProperties('org.freedesktop.systemd1.Unit', {'ActiveState': 'activating'})
if not hasattr(self, 'harness_pending_jobs'):
    self.harness_pending_jobs = []
self.harness_pending_jobs.append((job_id, job_path, name))
self.EmitSignal('org.freedesktop.systemd1.Manager', 'JobNew', 'uos', [dbus.UInt32(job_id), dbus.ObjectPath(job_path), name])
ret = dbus.ObjectPath(job_path)
"#;

/// Name of the harness's mock-control method on the systemd mock (interface
/// `org.freedesktop.DBus.Mock`): `HarnessFinishJobs(s result) -> as units`.
pub(crate) const FINISH_JOBS_METHOD: &str = "HarnessFinishJobs";

/// Body of [`FINISH_JOBS_METHOD`]: ends every pending job with `JobRemoved(id, path, unit, result)`
/// — what systemd sends when an operator runs `systemctl cancel` (result `canceled`) — and returns
/// the units whose jobs ended. logind answers with `PrepareForShutdown(false)`.
pub(crate) const FINISH_JOBS_CODE: &str = r#"
done = []
for (job_id, job_path, name) in getattr(self, 'harness_pending_jobs', []):
    objects[self.units[name]].UpdateProperties('org.freedesktop.systemd1.Unit', {'ActiveState': 'inactive'})
    self.EmitSignal('org.freedesktop.systemd1.Manager', 'JobRemoved', 'uoss', [dbus.UInt32(job_id), dbus.ObjectPath(job_path), name, str(args[0])])
    done.append(name)
self.harness_pending_jobs = []
ret = done
"#;

/// Code for `PowerOff`/`Reboot` on dbusmock's `logind` template, whose own versions do nothing:
/// announce the shutdown the way logind does, property first, then the signal.
pub(crate) const MOCK_LOGIND_SHUTDOWN_CODE: &str = r#"
self.UpdateProperties('org.freedesktop.login1.Manager', {'PreparingForShutdown': dbus.Boolean(True)})
self.EmitSignal('org.freedesktop.login1.Manager', 'PrepareForShutdown', 'b', [dbus.Boolean(True)])
"#;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unit_paths_match_systemd_escaping() {
        let cases = [
            (
                "poweroff.target",
                "/org/freedesktop/systemd1/unit/poweroff_2etarget",
            ),
            (
                "reboot.target",
                "/org/freedesktop/systemd1/unit/reboot_2etarget",
            ),
            (
                "systemd-logind.service",
                "/org/freedesktop/systemd1/unit/systemd_2dlogind_2eservice",
            ),
            ("9p.mount", "/org/freedesktop/systemd1/unit/_39p_2emount"),
            ("", "/org/freedesktop/systemd1/unit/_"),
        ];
        for (unit, path) in cases {
            assert_eq!(unit_object_path(unit), path, "unit {unit:?}");
        }
    }

    #[test]
    fn dropin_sets_delay_in_microseconds_and_keeps_logind_off_the_host() {
        let s = logind_dropin(Duration::from_millis(1500));
        assert!(s.contains("[Login]\n"));
        assert!(s.contains("InhibitDelayMaxSec=1500000us\n"));
        for key in [
            "NAutoVTs=0",
            "ReserveVT=0",
            "HandlePowerKey=ignore",
            "RemoveIPC=no",
        ] {
            assert!(s.contains(key), "missing {key}");
        }
    }

    #[test]
    fn bus_config_is_a_system_bus_on_the_given_socket() {
        let s = bus_config(Path::new("/tmp/x&y/bus.sock"));
        assert!(s.contains("<type>system</type>"));
        assert!(s.contains("<listen>unix:path=/tmp/x&amp;y/bus.sock</listen>"));
        assert!(!s.contains("servicedir"));
        assert!(!s.contains("pidfile"));
    }

    #[test]
    fn namespace_script_takes_paths_from_the_environment_only() {
        for var in [ENV_RUN_DIR, ENV_ETC_DIR, ENV_LOGIND] {
            assert!(
                LOGIND_NAMESPACE_SCRIPT.contains(&format!("\"${var}\"")),
                "{var}"
            );
        }
        assert!(LOGIND_NAMESPACE_SCRIPT.contains("exec "));
    }
}
