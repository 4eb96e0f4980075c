//! The D-Bus half: connect to the system bus, take and list locks, read the cap, find logind's
//! pid, and turn logind's signals and its bus name's comings and goings into [`LogindEvent`]s.

use std::collections::HashMap;
use std::time::Duration;

use futures::stream::{BoxStream, StreamExt};
use logind_zbus::manager::{InhibitType, ManagerProxy};
use zbus::proxy::CacheProperties;
use zbus::zvariant::{OwnedFd, OwnedValue};

use super::{InhibitorInfo, ShutdownKind, WHO, WHY};

/// logind's well-known bus name.
pub const LOGIN1: &str = "org.freedesktop.login1";

/// Errors talking to logind.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The system bus cannot be reached (`DBUS_SYSTEM_BUS_ADDRESS`, else
    /// `/run/dbus/system_bus_socket`).
    #[error("cannot connect to the D-Bus system bus: {0}")]
    Connect(#[source] zbus::Error),
    /// A call to logind or the bus failed.
    #[error("D-Bus call {call} failed: {source}")]
    Call {
        /// The method or property.
        call: &'static str,
        /// What the bus said.
        #[source]
        source: zbus::Error,
    },
}

impl Error {
    /// logind is not on the bus (restarting): wait for its name to come back.
    pub fn is_logind_absent(&self) -> bool {
        self.dbus_name().is_some_and(|n| {
            n == "org.freedesktop.DBus.Error.ServiceUnknown"
                || n == "org.freedesktop.DBus.Error.NameHasNoOwner"
        })
    }

    /// logind refuses new delay locks while a shutdown is in progress.
    pub fn is_operation_in_progress(&self) -> bool {
        self.dbus_name()
            .is_some_and(|n| n == "org.freedesktop.login1.OperationInProgress")
    }

    fn dbus_name(&self) -> Option<String> {
        use zbus::DBusError;
        match self {
            Error::Call {
                source: zbus::Error::MethodError(name, _, _),
                ..
            } => Some(name.to_string()),
            Error::Call {
                source: zbus::Error::FDO(e),
                ..
            } => Some(e.name().to_string()),
            _ => None,
        }
    }
}

fn call(name: &'static str) -> impl FnOnce(zbus::Error) -> Error {
    move |source| Error::Call { call: name, source }
}

/// What the agent hears from logind.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LogindEvent {
    /// `PrepareForShutdown(start)`, or `PrepareForShutdownWithMetadata(start, {type})` with the
    /// kind it names.
    PrepareForShutdown {
        /// `true`: a shutdown begins; `false`: it was cancelled.
        start: bool,
        /// From the metadata; `None` for the plain signal.
        kind: Option<ShutdownKind>,
    },
    /// logind's bus name got an owner (logind started or restarted).
    LogindAppeared,
    /// logind's bus name lost its owner (logind stopped or crashed).
    LogindVanished,
}

/// A [`LogindEvent`] with when the agent's process received it: a shutdown's deadline runs from
/// the signal's arrival, not from when a busy event loop got to it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Heard {
    /// When the signal arrived.
    pub at: tokio::time::Instant,
    /// What it said.
    pub event: LogindEvent,
}

/// `events`, each stamped with its arrival ([`Heard`]): a task of its own reads them as they
/// come, whatever the agent's loop is busy with; the stream ends when `events` does.
fn stamped(mut events: BoxStream<'static, LogindEvent>) -> BoxStream<'static, Heard> {
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    tokio::spawn(async move {
        while let Some(event) = events.next().await {
            let at = tokio::time::Instant::now();
            if tx.send(Heard { at, event }).is_err() {
                // The agent dropped the stream (it reconnects): nobody listens.
                return;
            }
        }
    });
    futures::stream::poll_fn(move |cx| rx.poll_recv(cx)).boxed()
}

/// A connection to logind on the system bus.
#[derive(Debug, Clone)]
pub struct Logind {
    conn: zbus::Connection,
    manager: ManagerProxy<'static>,
}

impl Logind {
    /// Connects to the system bus (honouring `DBUS_SYSTEM_BUS_ADDRESS`).
    pub async fn connect() -> Result<Self, Error> {
        let conn = zbus::Connection::system().await.map_err(Error::Connect)?;
        let manager = ManagerProxy::builder(&conn)
            .cache_properties(CacheProperties::No)
            .build()
            .await
            .map_err(call("login1 proxy"))?;
        Ok(Self { conn, manager })
    }

    /// The bus connection (shared with other clients on the system bus, such as PID 1's).
    pub fn connection(&self) -> &zbus::Connection {
        &self.conn
    }

    /// Takes nodeward's delay lock on shutdown; it lasts until the fd is closed.
    #[tracing::instrument(skip(self), err)]
    pub async fn take_lock(&self) -> Result<OwnedFd, Error> {
        self.manager
            .inhibit(InhibitType::Shutdown, WHO, WHY, "delay")
            .await
            .map_err(call("Inhibit"))
    }

    /// Asks logind to reboot the machine (`Reboot(false)`: no interactive authentication; the
    /// agent runs as root). Delay locks, nodeward's own among them, are honoured as for any
    /// reboot.
    #[tracing::instrument(skip(self), err)]
    pub async fn reboot(&self) -> Result<(), Error> {
        self.manager.reboot(false).await.map_err(call("Reboot"))
    }

    /// logind's `InhibitDelayMaxUSec`, read fresh.
    #[tracing::instrument(skip(self), err)]
    pub async fn inhibit_delay_max(&self) -> Result<Duration, Error> {
        self.manager
            .inhibit_delay_max_USec()
            .await
            .map(Duration::from_micros)
            .map_err(call("InhibitDelayMaxUSec"))
    }

    /// logind's `ListInhibitors`, read as raw `a(ssssuu)` so a lock type newer than
    /// logind-zbus knows cannot make the whole list unreadable.
    #[tracing::instrument(skip(self), err)]
    pub async fn list_inhibitors(&self) -> Result<Vec<InhibitorInfo>, Error> {
        let list: Vec<(String, String, String, String, u32, u32)> = self
            .manager
            .inner()
            .call("ListInhibitors", &())
            .await
            .map_err(call("ListInhibitors"))?;
        Ok(list
            .into_iter()
            .map(|(what, who, why, mode, uid, pid)| InhibitorInfo {
                what,
                who,
                why,
                mode,
                uid,
                pid,
            })
            .collect())
    }

    /// The kind of the shutdown in progress, from systemd 255's
    /// `PreparingForShutdownWithMetadata` property; `Unknown` where logind lacks it (252).
    pub async fn preparing_kind(&self) -> ShutdownKind {
        let meta: Result<HashMap<String, OwnedValue>, _> = self
            .manager
            .inner()
            .get_property("PreparingForShutdownWithMetadata")
            .await;
        meta.ok()
            .as_ref()
            .and_then(kind_of)
            .unwrap_or(ShutdownKind::Unknown)
    }

    /// logind's pid, from the bus (`GetConnectionUnixProcessID`).
    #[tracing::instrument(skip(self), err)]
    pub async fn logind_pid(&self) -> Result<u32, Error> {
        let dbus = zbus::fdo::DBusProxy::new(&self.conn)
            .await
            .map_err(call("DBus proxy"))?;
        let name = zbus::names::BusName::try_from(LOGIN1)
            .map_err(|e| call("bus name")(zbus::Error::from(e)))?;
        dbus.get_connection_unix_process_id(name)
            .await
            .map_err(|e| call("GetConnectionUnixProcessID")(e.into()))
    }

    /// logind's signals and its name's owner changes, as one stream. Subscribe before taking
    /// the lock so no signal is missed. The stream ends when the bus connection is lost.
    pub async fn events(&self) -> Result<BoxStream<'static, Heard>, Error> {
        let plain = self
            .manager
            .receive_prepare_for_shutdown()
            .await
            .map_err(call("subscribe PrepareForShutdown"))?
            .filter_map(|s| async move {
                s.args().ok().map(|a| LogindEvent::PrepareForShutdown {
                    start: a.start,
                    kind: None,
                })
            });
        let with_meta = self
            .manager
            .inner()
            .receive_signal("PrepareForShutdownWithMetadata")
            .await
            .map_err(call("subscribe PrepareForShutdownWithMetadata"))?
            .filter_map(|m| async move {
                let (start, meta): (bool, HashMap<String, OwnedValue>) =
                    m.body().deserialize().ok()?;
                Some(LogindEvent::PrepareForShutdown {
                    start,
                    kind: Some(kind_of(&meta).unwrap_or(ShutdownKind::Unknown)),
                })
            });
        let dbus = zbus::fdo::DBusProxy::new(&self.conn)
            .await
            .map_err(call("DBus proxy"))?;
        let owners = dbus
            .receive_name_owner_changed_with_args(&[(0, LOGIN1)])
            .await
            .map_err(call("subscribe NameOwnerChanged"))?
            .filter_map(|s| async move {
                let a = s.args().ok()?;
                Some(if a.new_owner().is_some() {
                    LogindEvent::LogindAppeared
                } else {
                    LogindEvent::LogindVanished
                })
            });
        // zbus closes every signal stream when the socket is lost, so the merged stream ends
        // and the agent knows to reconnect.
        let all = futures::stream::select(futures::stream::select(with_meta, owners), plain);
        Ok(stamped(all.boxed()))
    }
}

fn kind_of(meta: &HashMap<String, OwnedValue>) -> Option<ShutdownKind> {
    let v = meta.get("type")?;
    let s: &str = v.downcast_ref().ok()?;
    Some(ShutdownKind::from_metadata_type(s))
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use futures::StreamExt;

    use super::{LogindEvent, stamped};

    /// Item A of issue 41: a signal that waits in the stream while the event loop is busy (a
    /// Node write in flight) keeps the time it arrived, which starts the shutdown's deadline.
    #[tokio::test(start_paused = true)]
    async fn a_signal_is_stamped_when_it_arrives_not_when_it_is_read() {
        let (tx, rx) = futures::channel::mpsc::unbounded();
        let mut heard = stamped(rx.boxed());
        let sent = tokio::time::Instant::now();
        tx.unbounded_send(LogindEvent::LogindAppeared)
            .expect("send");
        // The loop is busy for a second before it reads the stream.
        tokio::time::sleep(Duration::from_secs(1)).await;
        let h = heard.next().await.expect("event");
        assert_eq!(h.event, LogindEvent::LogindAppeared);
        assert_eq!(h.at, sent, "stamped {:?} late", h.at - sent);
    }
}
