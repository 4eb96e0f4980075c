use super::*;

fn file_gate(path: &str, contains: Option<&str>) -> Gate {
    Gate::File(FileGate {
        path: PathBuf::from(path),
        contains: contains.map(|c| Pattern(regex::Regex::new(c).expect("regex"))),
    })
}

fn pod_gate() -> Gate {
    Gate::Pod(PodGate {
        namespace: "kube-flannel".into(),
        selector: Selector::parse("app=flannel").expect("selector"),
    })
}

fn cond(t: &str, expect: Expect) -> Gate {
    Gate::NodeCondition(ConditionGate {
        type_: t.into(),
        expect,
    })
}

fn http_gate() -> Gate {
    Gate::Http(HttpGate {
        url: "http://127.0.0.1:9099/health".parse().expect("uri"),
    })
}

fn flannel(ready: bool, terminating: bool) -> PodFact {
    PodFact {
        namespace: "kube-flannel".into(),
        name: "kube-flannel-ds-x".into(),
        labels: [("app".to_string(), "flannel".to_string())].into(),
        ready,
        terminating,
    }
}

fn conditions(pairs: &[(&str, &str)]) -> Option<BTreeMap<String, String>> {
    Some(
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
    )
}

const SUBNET: &str = "/run/flannel/subnet.env";

/// One gate against one set of facts: the state it must get.
#[test]
fn each_gate_kind() {
    let present = |c: &str| {
        let mut f = Facts::default();
        f.files
            .insert(PathBuf::from(SUBNET), FileFact::Present(c.into()));
        f
    };
    let with_file = |fact: FileFact| {
        let mut f = Facts::default();
        f.files.insert(PathBuf::from(SUBNET), fact);
        f
    };
    let with_pods = |pods: Vec<PodFact>| Facts {
        pods: Some(pods),
        ..Facts::default()
    };
    let with_conds = |pairs: &[(&str, &str)]| Facts {
        node_conditions: conditions(pairs),
        ..Facts::default()
    };
    let with_http = |fact: HttpFact| {
        let mut f = Facts::default();
        f.http.insert("http://127.0.0.1:9099/health".into(), fact);
        f
    };
    use GateState::{Fail, Pass, Unknown};
    let cases: Vec<(&str, Gate, Facts, GateState)> = vec![
        (
            "file unread",
            file_gate(SUBNET, None),
            Facts::default(),
            Unknown,
        ),
        (
            "file missing",
            file_gate(SUBNET, None),
            with_file(FileFact::Missing),
            Fail,
        ),
        ("file present", file_gate(SUBNET, None), present(""), Pass),
        (
            "file unreadable",
            file_gate(SUBNET, None),
            with_file(FileFact::Unreadable("EACCES".into())),
            Fail,
        ),
        (
            "content matches",
            file_gate(SUBNET, Some("FLANNEL_SUBNET=")),
            present("FLANNEL_NETWORK=10.244.0.0/16\nFLANNEL_SUBNET=10.244.1.1/24\n"),
            Pass,
        ),
        (
            "content half written",
            file_gate(SUBNET, Some("FLANNEL_SUBNET=")),
            present("FLANNEL_NETWORK=10.244.0.0/16\n"),
            Fail,
        ),
        ("pods not listed", pod_gate(), Facts::default(), Unknown),
        ("no flannel pod", pod_gate(), with_pods(vec![]), Fail),
        (
            "flannel not ready",
            pod_gate(),
            with_pods(vec![flannel(false, false)]),
            Fail,
        ),
        (
            "flannel ready",
            pod_gate(),
            with_pods(vec![flannel(true, false)]),
            Pass,
        ),
        (
            "flannel ready but terminating",
            pod_gate(),
            with_pods(vec![flannel(true, true)]),
            Fail,
        ),
        (
            "old one terminating, new one ready",
            pod_gate(),
            with_pods(vec![flannel(true, true), flannel(true, false)]),
            Pass,
        ),
        (
            "ready pod in another namespace",
            pod_gate(),
            with_pods(vec![PodFact {
                namespace: "default".into(),
                ..flannel(true, false)
            }]),
            Fail,
        ),
        (
            "node not registered",
            cond("Ready", Expect::Is("True".into())),
            Facts::default(),
            Unknown,
        ),
        (
            "Ready=True",
            cond("Ready", Expect::Is("True".into())),
            with_conds(&[("Ready", "True")]),
            Pass,
        ),
        (
            "Ready=False",
            cond("Ready", Expect::Is("True".into())),
            with_conds(&[("Ready", "False")]),
            Fail,
        ),
        (
            "Ready absent",
            cond("Ready", Expect::Is("True".into())),
            with_conds(&[]),
            Fail,
        ),
        (
            "NetworkUnavailable absent",
            cond("NetworkUnavailable", Expect::IsNot("True".into())),
            with_conds(&[("Ready", "True")]),
            Pass,
        ),
        (
            "NetworkUnavailable=True",
            cond("NetworkUnavailable", Expect::IsNot("True".into())),
            with_conds(&[("NetworkUnavailable", "True")]),
            Fail,
        ),
        (
            "NetworkUnavailable=False",
            cond("NetworkUnavailable", Expect::IsNot("True".into())),
            with_conds(&[("NetworkUnavailable", "False")]),
            Pass,
        ),
        ("http not probed", http_gate(), Facts::default(), Unknown),
        (
            "http 200",
            http_gate(),
            with_http(HttpFact::Status(200)),
            Pass,
        ),
        (
            "http 204",
            http_gate(),
            with_http(HttpFact::Status(204)),
            Pass,
        ),
        (
            "http 503",
            http_gate(),
            with_http(HttpFact::Status(503)),
            Fail,
        ),
        (
            "http refused",
            http_gate(),
            with_http(HttpFact::Failed("connection refused".into())),
            Fail,
        ),
    ];
    let t0 = Instant::now();
    for (name, gate, facts, want) in cases {
        let set = GateSet {
            gates: vec![gate],
            boot_deadline: Duration::from_secs(600),
        };
        let v = evaluate(&facts, &set, t0, t0);
        assert_eq!(v.gates[0].state, want, "{name}: {:?}", v.gates[0]);
        assert_eq!(v.all_pass, want == Pass, "{name}");
        assert!(!v.gates[0].reason.is_empty(), "{name}: a reason is given");
    }
}

#[test]
fn all_must_pass_and_overdue_only_after_the_deadline() {
    let set = GateSet {
        gates: vec![
            file_gate(SUBNET, Some("FLANNEL_SUBNET=")),
            pod_gate(),
            cond("Ready", Expect::Is("True".into())),
        ],
        boot_deadline: Duration::from_secs(600),
    };
    let mut facts = Facts {
        pods: Some(vec![flannel(true, false)]),
        node_conditions: conditions(&[("Ready", "True")]),
        ..Facts::default()
    };
    facts.files.insert(PathBuf::from(SUBNET), FileFact::Missing);
    let t0 = Instant::now();
    let before = evaluate(&facts, &set, t0, t0 + Duration::from_secs(599));
    assert!(!before.all_pass && !before.overdue);
    assert_eq!(before.failing(), ["file /run/flannel/subnet.env (missing)"]);
    let after = evaluate(&facts, &set, t0, t0 + Duration::from_secs(600));
    assert!(after.overdue, "deadline reached with a gate failing");

    facts.files.insert(
        PathBuf::from(SUBNET),
        FileFact::Present("FLANNEL_SUBNET=10.244.1.1/24".into()),
    );
    let passed = evaluate(&facts, &set, t0, t0 + Duration::from_secs(3600));
    assert!(passed.all_pass);
    assert!(!passed.overdue, "passing gates are never overdue");
    assert!(passed.failing().is_empty());
}

#[test]
fn no_gates_pass_at_once() {
    let set = GateSet {
        gates: vec![],
        boot_deadline: Duration::ZERO,
    };
    let t0 = Instant::now();
    let v = evaluate(&Facts::default(), &set, t0, t0);
    assert!(v.all_pass && !v.overdue);
}

#[test]
fn config_forms_are_validated() {
    let bad: &[(&str, &str)] = &[
        ("path = \"relative\"", "absolute"),
        ("path = \"/x\"\ncontains = \"(\"", "invalid regex"),
    ];
    for (text, needle) in bad {
        let e = toml::from_str::<FileGate>(text)
            .expect_err(text)
            .to_string();
        assert!(e.contains(needle), "{text}: {e}");
    }
    let e = toml::from_str::<ConditionGate>("type = \"Ready\"\nstatus = \"True\"\nnot = \"False\"")
        .expect_err("both")
        .to_string();
    assert!(e.contains("exactly one"), "{e}");
    let e = toml::from_str::<ConditionGate>("type = \"Ready\"\nstatus = \"yes\"")
        .expect_err("bad status")
        .to_string();
    assert!(e.contains("\"True\""), "{e}");
    let e = toml::from_str::<HttpGate>("url = \"https://x/health\"")
        .expect_err("https")
        .to_string();
    assert!(e.contains("http://"), "{e}");
    let e = toml::from_str::<PodGate>("namespace = \"kube-flannel\"\nselector = \"app=\"")
        .map(|_| ())
        .err();
    assert!(e.is_none(), "an empty value is a valid selector: {e:?}");
}

/// `gate`'s status alone, decided from `facts` at once.
fn only(gate: Gate, facts: &Facts) -> GateStatus {
    let set = GateSet {
        gates: vec![gate],
        boot_deadline: Duration::from_secs(600),
    };
    let t = Instant::now();
    evaluate(facts, &set, t, t).gates.remove(0)
}

#[test]
fn drain_access_gates_until_the_api_server_allows_every_need() {
    use crate::drain::access::Access;
    let verdict = |access: Option<Access>| {
        only(
            Gate::DrainAccess,
            &Facts {
                drain_access: access,
                ..Facts::default()
            },
        )
    };
    assert_eq!(verdict(None).state, GateState::Unknown);
    assert_eq!(verdict(Some(Access::Granted)).state, GateState::Pass);
    // An API server without SelfSubjectAccessReview cannot say; not held against the node.
    assert_eq!(verdict(Some(Access::Unverifiable)).state, GateState::Pass);
    let denied = verdict(Some(Access::Denied(vec![
        "list poddisruptionbudgets.policy".into(),
        "watch poddisruptionbudgets.policy".into(),
    ])));
    assert_eq!(denied.state, GateState::Fail);
    assert_eq!(
        denied.reason,
        "the drain would be refused: cannot list poddisruptionbudgets.policy, watch \
         poddisruptionbudgets.policy; apply packaging/kubernetes/rbac-agent.yaml"
    );
}

#[test]
fn a_kubelet_shutdown_lock_gates_the_node() {
    let verdict = |locks: Option<Vec<u32>>| {
        only(
            Gate::KubeletShutdownOff,
            &Facts {
                kubelet_shutdown_locks: locks,
                ..Facts::default()
            },
        )
    };
    assert_eq!(verdict(None).state, GateState::Unknown);
    assert_eq!(verdict(Some(vec![])).state, GateState::Pass);
    let on = verdict(Some(vec![812]));
    assert_eq!(on.state, GateState::Fail);
    assert!(
        on.reason
            .starts_with("kubelet (pid 812) holds a shutdown delay lock")
            && on.reason.contains("shutdownGracePeriod: 0s"),
        "{}",
        on.reason
    );
}
