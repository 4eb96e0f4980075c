//! What the node's pods show: a pod gone (watch event) or stopped (the node's own cgroups), and
//! the schedule told.

use super::*;

impl Drain<'_> {
    /// What the pod watch saw: a pod on the node (taken in), gone, or a relist.
    pub(super) fn pod_event(
        &self,
        schedule: &mut Schedule,
        pods: &mut Mirror<Pod>,
        daemonsets: &Mirror<PartialObjectMeta<DaemonSet>>,
        ev: watcher::Result<watcher::Event<Pod>>,
        surges: &mut Surges,
    ) -> Result<()> {
        let ev = match ev {
            Ok(ev) => ev,
            Err(e) => return check_watch_error(self.node, &e, "list and watch pods"),
        };
        pods.apply(&ev);
        match &ev {
            watcher::Event::Apply(p) => {
                self.track(schedule, p, daemonsets);
                if self.has_left(p) {
                    self.left(schedule, surges, p);
                }
            }
            watcher::Event::Delete(p) => self.left(schedule, surges, p),
            // A relist replaced the set: whatever it lacks (or has only as a stopped pod) is gone.
            watcher::Event::InitDone => {
                let present = self.on_node(pods);
                surges.end_all_but(self.client, &present);
                schedule.observe(&present);
            }
            watcher::Event::Init | watcher::Event::InitApply(_) => {}
        }
        Ok(())
    }

    /// Whether `pod` has left the node though its object is still there: never when the drain
    /// waits for objects ([`Gone`]), else [`plan::left_node`], with the node's own word on its
    /// containers when the drain runs there.
    pub(super) fn has_left(&self, pod: &Pod) -> bool {
        let Gone::Stopped(cgroups) = &self.opts.gone else {
            return false;
        };
        if pod.metadata.deletion_timestamp.is_none() {
            return false;
        }
        let running = cgroups.as_ref().and_then(|c| c.containers_running(pod));
        plan::left_node(pod, running)
    }

    /// The pods that have left though their objects are still there ([`Self::has_left`]).
    pub(super) fn stopped(&self, pods: &Mirror<Pod>) -> Vec<PodRef> {
        pods.state()
            .iter()
            .filter(|p| self.has_left(p))
            .map(|p| PodRef::of(p))
            .collect()
    }

    /// The UIDs of the pods still on the node: listed, and not [`Self::has_left`].
    pub(super) fn on_node(&self, pods: &Mirror<Pod>) -> BTreeSet<String> {
        pods.state()
            .iter()
            .filter(|p| !self.has_left(p))
            .filter_map(|p| p.metadata.uid.clone())
            .collect()
    }

    /// On the node it drains, a stopped container says so in the cgroup tree and nowhere the
    /// watch sees: looks at the pods being deleted every [`NODE_POLL`] until they have left.
    /// Answers when to look again, if there is anything to look for.
    pub(super) fn poll_node(
        &self,
        schedule: &mut Schedule,
        pods: &Mirror<Pod>,
        surges: &mut Surges,
        now: Instant,
    ) -> Option<Instant> {
        let Gone::Stopped(Some(_)) = &self.opts.gone else {
            return None;
        };
        let mut waiting = false;
        for p in pods.state() {
            let uid = p.metadata.uid.as_deref().unwrap_or_default();
            if p.metadata.deletion_timestamp.is_none()
                || schedule.get(uid).is_none_or(Tracked::settled)
            {
                continue;
            }
            if self.has_left(&p) {
                self.left(schedule, surges, &p);
            } else {
                waiting = true;
            }
        }
        waiting.then(|| later(now, NODE_POLL))
    }

    /// `pod` left the node: its object deleted, or its containers stopped ([`plan::left_node`]).
    pub(super) fn left(&self, schedule: &mut Schedule, surges: &mut Surges, pod: &Pod) {
        let uid = pod.metadata.uid.as_deref().unwrap_or_default();
        schedule.gone(uid);
        surges.end(self.client, uid);
    }
}
