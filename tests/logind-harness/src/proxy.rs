//! The few D-Bus interfaces the harness itself talks to, as zbus proxies.
//!
//! Properties are never cached: logind declares `InhibitDelayMaxUSec` constant
//! (`EmitsChangedSignal=const`) yet changes it on SIGHUP, so a caching proxy would keep showing
//! the old value after a reload.

use std::collections::HashMap;

use zbus::zvariant::{OwnedFd, OwnedValue, Value};

/// logind's well-known bus name.
pub const LOGIN1_NAME: &str = "org.freedesktop.login1";
/// logind's manager object.
pub const LOGIN1_PATH: &str = "/org/freedesktop/login1";
/// logind's manager interface.
pub const LOGIN1_MANAGER: &str = "org.freedesktop.login1.Manager";
/// systemd's (here: the mock's) well-known bus name.
pub const SYSTEMD1_NAME: &str = "org.freedesktop.systemd1";
/// systemd's manager object.
pub const SYSTEMD1_PATH: &str = "/org/freedesktop/systemd1";
/// systemd's manager interface.
pub const SYSTEMD1_MANAGER: &str = "org.freedesktop.systemd1.Manager";
/// systemd's unit interface.
pub const SYSTEMD1_UNIT: &str = "org.freedesktop.systemd1.Unit";
/// dbusmock's control interface, present on every mock object.
pub const MOCK_IFACE: &str = "org.freedesktop.DBus.Mock";

/// The parts of `org.freedesktop.login1.Manager` the harness uses.
#[zbus::proxy(
    interface = "org.freedesktop.login1.Manager",
    default_service = "org.freedesktop.login1",
    default_path = "/org/freedesktop/login1"
)]
pub(crate) trait LoginManager {
    /// `Inhibit(s what, s who, s why, s mode) -> h`.
    fn inhibit(&self, what: &str, who: &str, why: &str, mode: &str) -> zbus::Result<OwnedFd>;

    /// `ListInhibitors() -> a(ssssuu)`.
    fn list_inhibitors(&self) -> zbus::Result<Vec<(String, String, String, String, u32, u32)>>;

    /// `PowerOff(b interactive)`.
    fn power_off(&self, interactive: bool) -> zbus::Result<()>;

    /// `Reboot(b interactive)`.
    fn reboot(&self, interactive: bool) -> zbus::Result<()>;

    /// `CancelScheduledShutdown() -> b`.
    fn cancel_scheduled_shutdown(&self) -> zbus::Result<bool>;

    /// `InhibitDelayMaxUSec` (t, microseconds).
    #[zbus(property(emits_changed_signal = "false"), name = "InhibitDelayMaxUSec")]
    fn inhibit_delay_max_usec(&self) -> zbus::Result<u64>;
}

/// dbusmock's `org.freedesktop.DBus.Mock`, plus the systemd template's `AddMockUnit` and the
/// harness's own `HarnessFinishJobs`.
#[zbus::proxy(interface = "org.freedesktop.DBus.Mock")]
pub(crate) trait Mock {
    /// `AddObject(s path, s interface, a{sv} properties, a(ssss) methods)`.
    fn add_object(
        &self,
        path: &str,
        interface: &str,
        properties: HashMap<&str, Value<'_>>,
        methods: &[(&str, &str, &str, &str)],
    ) -> zbus::Result<()>;

    /// `AddMethod(s interface, s name, s in_sig, s out_sig, s code)`.
    fn add_method(
        &self,
        interface: &str,
        name: &str,
        in_sig: &str,
        out_sig: &str,
        code: &str,
    ) -> zbus::Result<()>;

    /// `AddProperty(s interface, s name, v value)`.
    fn add_property(&self, interface: &str, name: &str, value: &Value<'_>) -> zbus::Result<()>;

    /// `UpdateProperties(s interface, a{sv} properties)`; emits `PropertiesChanged`.
    fn update_properties(
        &self,
        interface: &str,
        properties: HashMap<&str, Value<'_>>,
    ) -> zbus::Result<()>;

    /// `EmitSignal(s interface, s name, s signature, av args)`.
    fn emit_signal(
        &self,
        interface: &str,
        name: &str,
        signature: &str,
        args: &[Value<'_>],
    ) -> zbus::Result<()>;

    /// `GetMethodCalls(s method) -> a(tav)`: (unix time in whole seconds, arguments).
    fn get_method_calls(&self, method: &str) -> zbus::Result<Vec<(u64, Vec<OwnedValue>)>>;

    /// `AddMockUnit(s name)` (systemd template only).
    fn add_mock_unit(&self, name: &str) -> zbus::Result<()>;

    /// `HarnessFinishJobs(s result) -> as` (added by the harness to the systemd mock).
    fn harness_finish_jobs(&self, result: &str) -> zbus::Result<Vec<String>>;

    /// `MethodCalled(s name, av args)`, sent for every call of a mocked method.
    #[zbus(signal)]
    fn method_called(&self, name: String, args: Vec<OwnedValue>) -> zbus::Result<()>;
}

/// The string inside a (possibly nested) variant, if it is one.
pub(crate) fn variant_str(v: &Value<'_>) -> Option<String> {
    match v {
        Value::Str(s) => Some(s.to_string()),
        Value::Value(inner) => variant_str(inner),
        _ => None,
    }
}
