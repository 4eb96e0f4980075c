//! What the node itself says about a pod's containers: its cgroup tree (v2), read by a drain that
//! runs on the node it drains (the agent's at shutdown, and the drain unit's).
//!
//! The API learns that an evicted pod's containers have stopped only when its kubelet's pod
//! worker is done with the whole pod: after the runtime has returned from stopping each
//! container, stopped the sandbox and torn its network down. On the real node under TCG that was
//! 25–35 s after the containers' last process had exited (containerd 1.6's shims answering
//! slowly, then every sandbox's CNI teardown), and a drain waiting for it held logind's lock that
//! long. A container's cgroup says it at once: with the systemd driver its `*.scope` goes when its
//! last process exits; with cgroupfs `cgroup.events` says `populated 0`.
//!
//! Only a positive finding counts: the pod's own cgroup is found where the kubelet puts it (by
//! its UID and QoS class, either driver, the default cgroup root), and none of the containers its
//! status names has a process. Anything else — cgroup v1, another root, no QoS class, a read
//! error — answers "unknown", and the drain goes by the API alone.

use std::path::{Path, PathBuf};

use k8s_openapi::api::core::v1::{ContainerStatus, Pod};

/// A node's cgroup v2 hierarchy.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Cgroups {
    root: PathBuf,
}

impl Cgroups {
    /// This machine's: `/sys/fs/cgroup`.
    pub fn system() -> Self {
        Self::at("/sys/fs/cgroup")
    }

    /// The hierarchy mounted at `root` (a copy of one, in tests).
    pub fn at(root: impl Into<PathBuf>) -> Self {
        Self { root: root.into() }
    }

    /// Whether any container `pod`'s status names still has a process on this node; `None`
    /// when the node cannot tell (the pod's cgroup is not where the kubelet puts it).
    pub fn containers_running(&self, pod: &Pod) -> Option<bool> {
        let uid = pod.metadata.uid.as_deref()?;
        let status = pod.status.as_ref()?;
        let qos = status.qos_class.as_deref()?;
        let dir = pod_dirs(uid, qos)
            .into_iter()
            .map(|d| self.root.join(d))
            .find(|d| d.is_dir())?;
        let ids = container_ids(pod);
        let mut running = false;
        for entry in std::fs::read_dir(&dir).ok()? {
            let entry = entry.ok()?;
            let name = entry.file_name();
            let name = name.to_string_lossy();
            if ids.iter().any(|id| name.contains(id.as_str())) {
                running |= populated(&entry.path())?;
            }
        }
        Some(running)
    }
}

/// Where the kubelet puts a pod's cgroup under the root, for each cgroup driver: systemd
/// (`kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod<uid with _>.slice`) and
/// cgroupfs (`kubepods/besteffort/pod<uid>`); Guaranteed pods sit directly under `kubepods`.
fn pod_dirs(uid: &str, qos: &str) -> Vec<PathBuf> {
    let tier = match qos {
        "Guaranteed" => None,
        "Burstable" => Some("burstable"),
        "BestEffort" => Some("besteffort"),
        _ => return Vec::new(),
    };
    let escaped = uid.replace('-', "_");
    let (systemd, cgroupfs) = match tier {
        None => (
            PathBuf::from(format!("kubepods.slice/kubepods-pod{escaped}.slice")),
            PathBuf::from(format!("kubepods/pod{uid}")),
        ),
        Some(t) => (
            PathBuf::from(format!(
                "kubepods.slice/kubepods-{t}.slice/kubepods-{t}-pod{escaped}.slice"
            )),
            PathBuf::from(format!("kubepods/{t}/pod{uid}")),
        ),
    };
    vec![systemd, cgroupfs]
}

/// The runtime's IDs of the pod's containers (init, regular, ephemeral) that were ever created:
/// `containerd://<id>` → `<id>`. The sandbox is not among them.
fn container_ids(pod: &Pod) -> Vec<String> {
    let Some(s) = pod.status.as_ref() else {
        return Vec::new();
    };
    [
        &s.init_container_statuses,
        &s.container_statuses,
        &s.ephemeral_container_statuses,
    ]
    .into_iter()
    .flatten()
    .flatten()
    .filter_map(|c: &ContainerStatus| c.container_id.as_deref())
    .filter_map(|id| id.split_once("://").map(|(_, id)| id))
    .filter(|id| !id.is_empty())
    .map(str::to_string)
    .collect()
}

/// Whether the cgroup at `dir` (or one below it) has a process: `populated` in `cgroup.events`.
/// `None` when that cannot be read, except that a cgroup removed meanwhile has none.
fn populated(dir: &Path) -> Option<bool> {
    match std::fs::read_to_string(dir.join("cgroup.events")) {
        Ok(events) => events.lines().find_map(|l| match l.trim() {
            "populated 1" => Some(true),
            "populated 0" => Some(false),
            _ => None,
        }),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound && !dir.exists() => Some(false),
        Err(_) => None,
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    const UID: &str = "0df74278-a857-4806-8ca3-dda6671abfdc";
    const APP: &str = "9ad8318eb47c5ee006d884452b3ee2f7231cb32cc26a22164c633c1f808eb0d6";
    const SIDE: &str = "b85196f7b57a66eec6c3d47cfd9505288c9987649e2fa12fe6a5eda5a8b17b29";
    const SANDBOX: &str = "67216c25075ed7c152a46b5ad6126ae5c53faa5d67919e518ef11cc588b17cbd";

    fn pod(qos: &str) -> Pod {
        serde_json::from_value(json!({
            "metadata": {"name": "web", "namespace": "default", "uid": UID},
            "status": {
                "qosClass": qos,
                "containerStatuses": [
                    {"name": "app", "image": "i", "imageID": "", "ready": false, "restartCount": 0,
                     "containerID": format!("containerd://{APP}")},
                    {"name": "side", "image": "i", "imageID": "", "ready": false, "restartCount": 0,
                     "containerID": format!("containerd://{SIDE}")}
                ]
            }
        }))
        .expect("pod")
    }

    /// A cgroup directory with `populated` as given.
    fn cgroup(dir: &Path, populated: bool) {
        std::fs::create_dir_all(dir).expect("mkdir");
        let events = format!("populated {}\nfrozen 0\n", u8::from(populated));
        std::fs::write(dir.join("cgroup.events"), events).expect("cgroup.events");
    }

    fn systemd_pod_dir(root: &Path) -> PathBuf {
        root.join("kubepods.slice/kubepods-besteffort.slice")
            .join(format!(
                "kubepods-besteffort-pod{}.slice",
                UID.replace('-', "_")
            ))
    }

    #[test]
    fn systemd_driver_scopes_go_when_their_processes_exit() {
        let root = tempfile::tempdir().expect("tempdir");
        let cg = Cgroups::at(root.path());
        let pod_dir = systemd_pod_dir(root.path());
        cgroup(&pod_dir, true);
        let scope = |id: &str| pod_dir.join(format!("cri-containerd-{id}.scope"));
        cgroup(&scope(SANDBOX), true);
        cgroup(&scope(APP), true);
        cgroup(&scope(SIDE), true);
        assert_eq!(cg.containers_running(&pod("BestEffort")), Some(true));
        std::fs::remove_dir_all(scope(APP)).expect("rm");
        assert_eq!(
            cg.containers_running(&pod("BestEffort")),
            Some(true),
            "one container still runs"
        );
        std::fs::remove_dir_all(scope(SIDE)).expect("rm");
        assert_eq!(
            cg.containers_running(&pod("BestEffort")),
            Some(false),
            "only the sandbox is left, and it is not one of the pod's containers"
        );
    }

    #[test]
    fn cgroupfs_driver_says_populated_0() {
        let root = tempfile::tempdir().expect("tempdir");
        let cg = Cgroups::at(root.path());
        let pod_dir = root.path().join(format!("kubepods/pod{UID}"));
        cgroup(&pod_dir.join(APP), false);
        cgroup(&pod_dir.join(SIDE), true);
        assert_eq!(cg.containers_running(&pod("Guaranteed")), Some(true));
        cgroup(&pod_dir.join(SIDE), false);
        assert_eq!(cg.containers_running(&pod("Guaranteed")), Some(false));
    }

    #[test]
    fn anything_it_cannot_find_or_read_is_unknown() {
        let root = tempfile::tempdir().expect("tempdir");
        let cg = Cgroups::at(root.path());
        assert_eq!(
            cg.containers_running(&pod("BestEffort")),
            None,
            "no pod cgroup"
        );
        let pod_dir = systemd_pod_dir(root.path());
        cgroup(&pod_dir, true);
        assert_eq!(
            cg.containers_running(&pod("Burstable")),
            None,
            "the cgroup of another QoS class is not this pod's"
        );
        let mut no_qos = pod("BestEffort");
        no_qos.status.as_mut().expect("status").qos_class = None;
        assert_eq!(cg.containers_running(&no_qos), None, "no QoS class");
        let scope = pod_dir.join(format!("cri-containerd-{APP}.scope"));
        std::fs::create_dir_all(&scope).expect("mkdir");
        assert_eq!(
            cg.containers_running(&pod("BestEffort")),
            None,
            "a container cgroup without cgroup.events (cgroup v1)"
        );
    }
}
