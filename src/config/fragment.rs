//! Per-file fragments: every key optional, merged key by key, then resolved against defaults.

use std::path::PathBuf;

use serde::Deserialize;

use super::Settings;
use super::reboot::{
    AlertFilter, Days, HttpUrl, RebootSettings, SelectorText, TimeOfDay, Unavailable, Zone,
};
use super::scaler::{
    Argv, BaseUrl, Capacity, CherryGroupSettings, CherrySettings, ExecSettings, Expander,
    GroupEntry, GroupSettings, Groups, IpAddressIds, Label, LabelKeys, Labels, LeaseDuration,
    ListenAddr, Percent, ProviderKind, ScalerSettings, Share, Taints, TokenTtl, default_template,
};
use super::types::{
    Deadline, NodeName, OnDeadline, Period, Positive, ShutdownPolicy, TaintOwner,
    UnsatisfiableBudgets, Wait, Waves,
};
use crate::gate::{ConditionGate, FileGate, HttpGate, PodGate};
use crate::window::Window;
use jiff::civil::Weekday;

/// Declares a fragment section whose fields are all `Option`, with a `merge` where the later
/// fragment's set fields win.
macro_rules! fragment {
    ($(#[$m:meta])* $name:ident { $($(#[$fm:meta])* $field:ident : $ty:ty),* $(,)? }) => {
        $(#[$m])*
        #[derive(Debug, Default, Deserialize)]
        #[serde(deny_unknown_fields)]
        pub(crate) struct $name { $($(#[$fm])* pub(crate) $field: Option<$ty>,)* }

        impl $name {
            fn merge(&mut self, later: Self) {
                $(if later.$field.is_some() { self.$field = later.$field; })*
            }
        }
    };
}

/// A whole config file; sections merge key by key.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct Fragment {
    /// `[node]`
    node: Option<NodeFragment>,
    /// `[drain]`
    drain: Option<DrainFragment>,
    /// `[agent]`
    agent: Option<AgentFragment>,
    /// `[gates]`
    gates: Option<GatesFragment>,
    /// `[shutdown]`
    shutdown: Option<ShutdownFragment>,
    /// `[scaler]`
    scaler: Option<ScalerFragment>,
    /// `[reboot]`
    reboot: Option<RebootFragment>,
    /// `[conditions]`
    conditions: Option<ConditionsFragment>,
}

fragment!(
    /// `[conditions]`
    ConditionsFragment {
        /// Kubernetes' lifecycle conditions.
        lifecycle: bool,
    }
);

fragment!(
    /// `[reboot]`
    RebootFragment {
        /// On/off.
        enabled: bool,
        /// Sentinel file.
        sentinel: PathBuf,
        /// Sentinel command.
        sentinel_command: Argv,
        /// `nodeward reboot`'s request file.
        request_file: PathBuf,
        /// Check period.
        period: Period,
        /// Slots.
        concurrency: Positive,
        /// Slot namespace.
        namespace: Label,
        /// Slot Lease duration.
        lease_duration: LeaseDuration,
        /// Window days.
        days: Days,
        /// Window start.
        start_time: TimeOfDay,
        /// Window end.
        end_time: TimeOfDay,
        /// Window zone.
        time_zone: Zone,
        /// Blocking pods on this node.
        blocking_pods: SelectorText,
        /// Blocking pods anywhere.
        blocking_pods_anywhere: SelectorText,
        /// Prometheus API.
        prometheus_url: HttpUrl,
        /// Ignored alerts.
        alerts_ignored: AlertFilter,
        /// Health gate.
        max_unavailable: Unavailable,
        /// Nodes the health gate counts.
        health_nodes: SelectorText,
        /// Drain deadline.
        drain_timeout: Deadline,
        /// Settle time.
        settle_time: Wait,
        /// Reboot command.
        reboot_command: Argv,
        /// How long the node may stay up once the reboot is asked for.
        reboot_timeout: Deadline,
    }
);

impl RebootFragment {
    fn into_settings(self, d: RebootSettings) -> RebootSettings {
        let w = Window::default();
        let (zone_name, zone) = self.time_zone.map_or_else(
            || ("UTC".to_string(), jiff::tz::TimeZone::UTC),
            |z| (z.0, z.1),
        );
        let window = if self.days.is_none()
            && self.start_time.is_none()
            && self.end_time.is_none()
            && zone_name == "UTC"
        {
            w
        } else {
            let all = [
                Weekday::Monday,
                Weekday::Tuesday,
                Weekday::Wednesday,
                Weekday::Thursday,
                Weekday::Friday,
                Weekday::Saturday,
                Weekday::Sunday,
            ];
            let days = self.days.map_or_else(|| all.to_vec(), |x| x.0);
            let start = self
                .start_time
                .map_or(jiff::civil::Time::midnight(), |t| t.0);
            let end = self.end_time.map_or(jiff::civil::Time::midnight(), |t| t.0);
            Window::new(&days, start, end, zone, &zone_name)
        };
        RebootSettings {
            enabled: self.enabled.unwrap_or(d.enabled),
            sentinel: self.sentinel.unwrap_or(d.sentinel),
            sentinel_command: self.sentinel_command.map(|a| a.0).or(d.sentinel_command),
            request_file: self.request_file.unwrap_or(d.request_file),
            period: self.period.map_or(d.period, |t| t.0),
            concurrency: self.concurrency.map_or(d.concurrency, |c| c.0),
            namespace: self.namespace.map_or(d.namespace, |l| l.0),
            lease_duration: self.lease_duration.map_or(d.lease_duration, |t| t.0),
            window,
            blocking_pods: self.blocking_pods.map(|s| s.0).or(d.blocking_pods),
            blocking_pods_anywhere: self
                .blocking_pods_anywhere
                .map(|s| s.0)
                .or(d.blocking_pods_anywhere),
            prometheus_url: self.prometheus_url.map(|u| u.0).or(d.prometheus_url),
            alerts_ignored: self.alerts_ignored.or(d.alerts_ignored),
            max_unavailable: self.max_unavailable.or(d.max_unavailable),
            health_nodes: self.health_nodes.map(|s| s.0).or(d.health_nodes),
            drain_timeout: self.drain_timeout.map_or(d.drain_timeout, |t| t.0),
            settle_time: self.settle_time.map_or(d.settle_time, |t| t.0),
            reboot_command: self.reboot_command.map(|a| a.0).or(d.reboot_command),
            reboot_timeout: self.reboot_timeout.map_or(d.reboot_timeout, |t| t.0),
        }
    }
}

fragment!(
    /// `[agent]`
    AgentFragment {
        /// Status file.
        status_file: PathBuf,
        /// Boot deadline.
        boot_deadline: Deadline,
        /// Re-taint when a gate fails after passing.
        retaint_on_gate_failure: bool,
        /// Who removes the startup taint.
        startup_taint: TaintOwner,
        /// Metrics listen address.
        metrics_address: ListenAddr,
    }
);

fragment!(
    /// `[gates]`
    GatesFragment {
        /// File gates.
        file: Vec<FileGate>,
        /// Pod gates.
        pod: Vec<PodGate>,
        /// Node condition gates.
        node_condition: Vec<ConditionGate>,
        /// HTTP gates.
        http: Vec<HttpGate>,
        /// HTTP probe interval.
        http_interval: Period,
        /// HTTP probe timeout.
        http_timeout: Period,
    }
);

fragment!(
    /// `[shutdown]`
    ShutdownFragment {
        /// Policy for power-off.
        on_poweroff: ShutdownPolicy,
        /// Policy for reboot.
        on_reboot: ShutdownPolicy,
        /// Policy when logind does not say which.
        on_unknown: ShutdownPolicy,
        /// Margin below logind's cap.
        safety_margin: Wait,
        /// Cap to configure.
        inhibit_delay_max: Deadline,
        /// Drop-in path.
        logind_dropin: PathBuf,
    }
);

fragment!(
    /// `[node]`
    NodeFragment {
        /// Node name.
        name: NodeName,
        /// Kubeconfig path.
        kubeconfig: PathBuf,
    }
);

fragment!(
    /// `[drain]`
    DrainFragment {
        /// Deadline.
        timeout: Deadline,
        /// Deadline policy.
        on_deadline: OnDeadline,
        /// Unsatisfiable budgets.
        unsatisfiable_budgets: UnsatisfiableBudgets,
        /// Evict unmanaged pods.
        force: bool,
        /// Evict emptyDir pods (operator's drain).
        delete_emptydir_data: bool,
        /// Evict emptyDir pods (leaving node).
        delete_emptydir_data_on_shutdown: bool,
        /// Evictions in flight.
        concurrency: Positive,
        /// Exclude from load balancers while draining.
        exclude_from_load_balancers: bool,
        /// Priority waves.
        waves: Waves,
        /// Surge before evict.
        surge: bool,
    }
);

fragment!(
    /// `[scaler]`
    ScalerFragment {
        /// Cluster name.
        cluster_name: Label,
        /// Kubeconfig.
        kubeconfig: PathBuf,
        /// Provider.
        provider: ProviderKind,
        /// Pass interval.
        scan_interval: Period,
        /// Quiet time that ends a burst of pending pods.
        batch_idle: Wait,
        /// Longest a burst of pending pods waits for its pass.
        batch_max: Wait,
        /// Expander.
        expander: Expander,
        /// Scale-down on/off.
        scale_down_enabled: bool,
        /// Utilisation threshold.
        scale_down_utilization_threshold: Share,
        /// Unneeded time.
        scale_down_unneeded_time: Wait,
        /// No scale-down this long after the last scale-up.
        scale_down_delay_after_add: Wait,
        /// Machines created per pass at most.
        max_boots_per_pass: Positive,
        /// Labels of control-plane hosts.
        controller_node_labels: LabelKeys,
        /// Label new nodes `pool=<group>`.
        pool_label: bool,
        /// Empty nodes per pass.
        max_empty_bulk_delete: Positive,
        /// Provision timeout.
        max_provision_time: Deadline,
        /// NotReady timeout.
        unready_delete_time: Deadline,
        /// Guard: NotReady share.
        max_unready_percent: Percent,
        /// Guard: NotReady count always tolerated.
        ok_unready_count: u32,
        /// Guard per group: NotReady share.
        max_unready_group_percent: Percent,
        /// NotReady repairs per pass.
        max_unready_repairs_per_pass: Positive,
        /// First back-off.
        backoff_initial: Period,
        /// Longest back-off.
        backoff_max: Deadline,
        /// Values file.
        values: PathBuf,
        /// Token lifetime.
        token_ttl: TokenTtl,
        /// Token groups.
        token_extra_groups: Vec<String>,
        /// Metrics address.
        metrics_address: ListenAddr,
        /// Lease and status namespace.
        namespace: Label,
        /// Lease name.
        lease_name: Label,
        /// Lease duration.
        lease_duration: LeaseDuration,
        /// `[scaler.cherry]`
        cherry: CherryFragment,
        /// `[scaler.exec]`
        exec: ExecFragment,
        /// `[scaler.group_defaults]`
        group_defaults: GroupDefaultsFragment,
        /// `[[scaler.groups]]`, replaced whole.
        groups: Groups,
    }
);

fragment!(
    /// `[scaler.group_defaults]`: what a group leaves out.
    GroupDefaultsFragment {
        /// Plan.
        plan: String,
        /// Region.
        region: String,
        /// Image.
        image: String,
        /// SSH key ids.
        ssh_keys: Vec<String>,
        /// Labels; a group's own labels are added to these, key by key.
        labels: Labels,
        /// Taints.
        taints: Taints,
        /// Template.
        template: PathBuf,
        /// Hostname pattern.
        hostname_pattern: String,
        /// Capacity.
        capacity: Capacity,
        /// Cherry `os_partition_size`.
        os_partition_size: Positive,
        /// Cherry `spot_market`.
        spot_market: bool,
        /// Cherry `ip_addresses`.
        ip_addresses: IpAddressIds,
    }
);

/// The label the Cherry Servers cluster-autoscaler puts on its nodes, `pool=<node group>`, which
/// its users' node affinities select.
pub(crate) const POOL_LABEL: &str = "pool";

impl GroupEntry {
    /// The group with what it leaves out taken from `d`, then from the built-in defaults. Labels
    /// add up (the group's win per key); everything else the group sets replaces the default.
    fn resolve(self, d: &GroupDefaultsFragment, pool_label: bool) -> GroupSettings {
        let mut labels = d.labels.clone().unwrap_or_default().0;
        labels.extend(self.labels.unwrap_or_default().0);
        if pool_label {
            labels
                .entry(POOL_LABEL.to_string())
                .or_insert_with(|| self.name.clone());
        }
        GroupSettings {
            min: self.min,
            max: self.max,
            standby: self.standby,
            priority: self.priority,
            plan: self.plan.or_else(|| d.plan.clone()).unwrap_or_default(),
            region: self.region.or_else(|| d.region.clone()).unwrap_or_default(),
            image: self.image.or_else(|| d.image.clone()).unwrap_or_default(),
            ssh_keys: self
                .ssh_keys
                .or_else(|| d.ssh_keys.clone())
                .unwrap_or_default(),
            labels,
            taints: self
                .taints
                .or_else(|| d.taints.clone())
                .unwrap_or_default()
                .0,
            template: self
                .template
                .or_else(|| d.template.clone())
                .unwrap_or_else(default_template),
            hostname_pattern: self.hostname_pattern.or_else(|| d.hostname_pattern.clone()),
            capacity: self
                .capacity
                .or_else(|| d.capacity.clone())
                .unwrap_or_default(),
            cherry: CherryGroupSettings {
                os_partition_size: self.os_partition_size.or(d.os_partition_size).map(|p| p.0),
                spot_market: self.spot_market.or(d.spot_market).unwrap_or(false),
                ip_addresses: self
                    .ip_addresses
                    .or_else(|| d.ip_addresses.clone())
                    .unwrap_or_default()
                    .0,
            },
            name: self.name,
        }
    }
}

fragment!(
    /// `[scaler.cherry]`
    CherryFragment {
        /// Base URL.
        api_url: BaseUrl,
        /// Project.
        project_id: u64,
        /// Token file.
        token_file: PathBuf,
        /// CA certificates for the API.
        ca_file: PathBuf,
        /// Request timeout.
        request_timeout: Period,
    }
);

fragment!(
    /// `[scaler.exec]`
    ExecFragment {
        /// Create command.
        create: Argv,
        /// Delete command.
        delete: Argv,
        /// List command.
        list: Argv,
        /// Timeout.
        timeout: Period,
    }
);

impl CherryFragment {
    fn into_settings(self, d: CherrySettings) -> CherrySettings {
        CherrySettings {
            api_url: self.api_url.map_or(d.api_url, |u| u.0),
            project_id: self.project_id.or(d.project_id),
            token_file: self.token_file.or(d.token_file),
            ca_file: self.ca_file.or(d.ca_file),
            request_timeout: self.request_timeout.map_or(d.request_timeout, |t| t.0),
        }
    }
}

impl ExecFragment {
    fn into_settings(self, d: ExecSettings) -> ExecSettings {
        ExecSettings {
            create: self.create.map_or(d.create, |a| a.0),
            delete: self.delete.map_or(d.delete, |a| a.0),
            list: self.list.map_or(d.list, |a| a.0),
            timeout: self.timeout.map_or(d.timeout, |t| t.0),
        }
    }
}

impl ScalerFragment {
    /// Merges the nested tables key by key too (plain `merge` would replace them whole).
    fn merge_nested(&mut self, mut later: Self) {
        let cherry = later.cherry.take();
        let exec = later.exec.take();
        let group_defaults = later.group_defaults.take();
        self.merge(later);
        if let Some(c) = cherry {
            self.cherry.get_or_insert_default().merge(c);
        }
        if let Some(e) = exec {
            self.exec.get_or_insert_default().merge(e);
        }
        if let Some(g) = group_defaults {
            self.group_defaults.get_or_insert_default().merge(g);
        }
    }

    fn into_settings(self, d: ScalerSettings) -> ScalerSettings {
        let cherry = self.cherry.unwrap_or_default();
        let exec = self.exec.unwrap_or_default();
        let group_defaults = self.group_defaults.unwrap_or_default();
        let pool_label = self.pool_label.unwrap_or(false);
        let max_provision_time = self
            .max_provision_time
            .map_or(d.max_provision_time, |t| t.0);
        ScalerSettings {
            cluster_name: self.cluster_name.map_or(d.cluster_name, |l| l.0),
            kubeconfig: self.kubeconfig.or(d.kubeconfig),
            provider: self.provider.unwrap_or(d.provider),
            scan_interval: self.scan_interval.map_or(d.scan_interval, |t| t.0),
            batch_idle: self.batch_idle.map_or(d.batch_idle, |t| t.0),
            batch_max: self.batch_max.map_or(d.batch_max, |t| t.0),
            expander: self.expander.unwrap_or(d.expander),
            scale_down_enabled: self.scale_down_enabled.unwrap_or(d.scale_down_enabled),
            scale_down_utilization_threshold: self
                .scale_down_utilization_threshold
                .map_or(d.scale_down_utilization_threshold, |s| s.0),
            scale_down_unneeded_time: self
                .scale_down_unneeded_time
                .map_or(d.scale_down_unneeded_time, |t| t.0),
            scale_down_delay_after_add: self
                .scale_down_delay_after_add
                .map_or(d.scale_down_delay_after_add, |t| t.0),
            max_boots_per_pass: self
                .max_boots_per_pass
                .map(|c| c.0)
                .or(d.max_boots_per_pass),
            controller_node_labels: self
                .controller_node_labels
                .map_or(d.controller_node_labels, |l| l.0),
            max_empty_bulk_delete: self
                .max_empty_bulk_delete
                .map_or(d.max_empty_bulk_delete, |c| c.0),
            max_provision_time,
            unready_delete_time: self
                .unready_delete_time
                .map_or(d.unready_delete_time, |t| t.0),
            max_unready_percent: self
                .max_unready_percent
                .map_or(d.max_unready_percent, |p| p.0),
            ok_unready_count: self.ok_unready_count.unwrap_or(d.ok_unready_count),
            max_unready_group_percent: self
                .max_unready_group_percent
                .map_or(d.max_unready_group_percent, |p| p.0),
            max_unready_repairs_per_pass: self
                .max_unready_repairs_per_pass
                .map_or(d.max_unready_repairs_per_pass, |c| c.0),
            backoff_initial: self.backoff_initial.map_or(d.backoff_initial, |t| t.0),
            backoff_max: self.backoff_max.map_or(d.backoff_max, |t| t.0),
            values: self.values.unwrap_or(d.values),
            // Unset: as long as a machine may take to register, after which it is deleted.
            token_ttl: self.token_ttl.map_or_else(
                || max_provision_time.min(super::scaler::MAX_TOKEN_TTL),
                |t| t.0,
            ),
            token_extra_groups: self.token_extra_groups.unwrap_or(d.token_extra_groups),
            metrics_address: self.metrics_address.map_or(d.metrics_address, |a| a.0),
            namespace: self.namespace.map_or(d.namespace, |l| l.0),
            lease_name: self.lease_name.map_or(d.lease_name, |l| l.0),
            lease_duration: self.lease_duration.map_or(d.lease_duration, |t| t.0),
            cherry: cherry.into_settings(d.cherry),
            exec: exec.into_settings(d.exec),
            groups: self.groups.map_or(d.groups, |g| {
                g.0.into_iter()
                    .map(|e| e.resolve(&group_defaults, pool_label))
                    .collect()
            }),
        }
    }
}

impl Fragment {
    /// Merges a later fragment into this one, section by section.
    pub(crate) fn merge(&mut self, later: Fragment) {
        if let Some(b) = later.node {
            self.node.get_or_insert_default().merge(b);
        }
        if let Some(b) = later.drain {
            self.drain.get_or_insert_default().merge(b);
        }
        if let Some(b) = later.agent {
            self.agent.get_or_insert_default().merge(b);
        }
        if let Some(b) = later.gates {
            self.gates.get_or_insert_default().merge(b);
        }
        if let Some(b) = later.shutdown {
            self.shutdown.get_or_insert_default().merge(b);
        }
        if let Some(b) = later.scaler {
            self.scaler.get_or_insert_default().merge_nested(b);
        }
        if let Some(b) = later.reboot {
            self.reboot.get_or_insert_default().merge(b);
        }
        if let Some(b) = later.conditions {
            self.conditions.get_or_insert_default().merge(b);
        }
    }

    /// Fills every unset key from [`Settings::default`].
    pub(crate) fn into_settings(self) -> Settings {
        let d = Settings::default();
        let node = self.node.unwrap_or_default();
        let drain = self.drain.unwrap_or_default();
        let agent = self.agent.unwrap_or_default();
        let gates = self.gates.unwrap_or_default();
        let shutdown = self.shutdown.unwrap_or_default();
        let scaler = self.scaler.unwrap_or_default().into_settings(d.scaler);
        let reboot = self.reboot.unwrap_or_default().into_settings(d.reboot);
        let conditions = self.conditions.unwrap_or_default();
        Settings {
            node: super::NodeSettings {
                name: node.name.map(|n| n.0).or(d.node.name),
                kubeconfig: node.kubeconfig.or(d.node.kubeconfig),
            },
            drain: super::DrainSettings {
                timeout: drain.timeout.map_or(d.drain.timeout, |t| t.0),
                on_deadline: drain.on_deadline.unwrap_or(d.drain.on_deadline),
                unsatisfiable_budgets: drain
                    .unsatisfiable_budgets
                    .unwrap_or(d.drain.unsatisfiable_budgets),
                force: drain.force.unwrap_or(d.drain.force),
                delete_emptydir_data: drain
                    .delete_emptydir_data
                    .unwrap_or(d.drain.delete_emptydir_data),
                delete_emptydir_data_on_shutdown: drain
                    .delete_emptydir_data_on_shutdown
                    .unwrap_or(d.drain.delete_emptydir_data_on_shutdown),
                concurrency: drain.concurrency.map_or(d.drain.concurrency, |c| c.0),
                exclude_from_load_balancers: drain
                    .exclude_from_load_balancers
                    .unwrap_or(d.drain.exclude_from_load_balancers),
                waves: drain.waves.map_or(d.drain.waves, |w| w.0),
                surge: drain.surge.unwrap_or(d.drain.surge),
            },
            agent: super::AgentSettings {
                status_file: agent.status_file.unwrap_or(d.agent.status_file),
                boot_deadline: agent.boot_deadline.map_or(d.agent.boot_deadline, |t| t.0),
                retaint_on_gate_failure: agent
                    .retaint_on_gate_failure
                    .unwrap_or(d.agent.retaint_on_gate_failure),
                startup_taint: agent.startup_taint.unwrap_or(d.agent.startup_taint),
                metrics_address: agent
                    .metrics_address
                    .map_or(d.agent.metrics_address, |a| a.0),
            },
            gates: super::GateSettings {
                file: gates.file.unwrap_or(d.gates.file),
                pod: gates.pod.unwrap_or(d.gates.pod),
                node_condition: gates.node_condition.unwrap_or(d.gates.node_condition),
                http: gates.http.unwrap_or(d.gates.http),
                http_interval: gates.http_interval.map_or(d.gates.http_interval, |t| t.0),
                http_timeout: gates.http_timeout.map_or(d.gates.http_timeout, |t| t.0),
            },
            shutdown: super::ShutdownSettings {
                on_poweroff: shutdown.on_poweroff.unwrap_or(d.shutdown.on_poweroff),
                on_reboot: shutdown.on_reboot.unwrap_or(d.shutdown.on_reboot),
                on_unknown: shutdown.on_unknown.unwrap_or(d.shutdown.on_unknown),
                safety_margin: shutdown
                    .safety_margin
                    .map_or(d.shutdown.safety_margin, |t| t.0),
                inhibit_delay_max: shutdown
                    .inhibit_delay_max
                    .map_or(d.shutdown.inhibit_delay_max, |t| t.0),
                logind_dropin: shutdown.logind_dropin.unwrap_or(d.shutdown.logind_dropin),
            },
            scaler,
            reboot,
            conditions: super::ConditionsSettings {
                lifecycle: conditions.lifecycle.unwrap_or(d.conditions.lifecycle),
            },
        }
    }
}
