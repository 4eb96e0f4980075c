//! Firing alerts from a Prometheus-compatible API (`GET /api/v1/alerts`: Prometheus, Thanos
//! Ruler, VictoriaMetrics' vmalert, Mimir's ruler), which hold a coordinated reboot while any
//! fires that is not ignored, as kured's `--prometheus-url` does.

use std::time::Duration;

use serde::Deserialize;

/// `GET /api/v1/alerts`'s answer, the parts read.
#[derive(Debug, Deserialize)]
struct Answer {
    status: String,
    data: Option<Data>,
}

#[derive(Debug, Deserialize)]
struct Data {
    alerts: Vec<Alert>,
}

#[derive(Debug, Deserialize)]
struct Alert {
    labels: std::collections::BTreeMap<String, String>,
    state: String,
}

/// The names of the alerts firing now (pending ones are not firing yet), sorted and without
/// repeats. An API that cannot be asked is an error: the reboot waits, as kured's does, rather
/// than go ahead blind.
pub async fn firing(
    client: &reqwest::Client,
    base: &str,
    timeout: Duration,
) -> Result<Vec<String>, String> {
    let url = format!("{base}/api/v1/alerts");
    let answer = client
        .get(&url)
        .timeout(timeout)
        .send()
        .await
        .and_then(reqwest::Response::error_for_status)
        .map_err(|e| format!("cannot ask {url} for firing alerts: {e}"))?;
    let answer: Answer = answer
        .json()
        .await
        .map_err(|e| format!("{url} did not answer with Prometheus's alerts JSON: {e}"))?;
    names(answer).map_err(|status| format!("{url} answered with status {status:?}"))
}

fn names(answer: Answer) -> Result<Vec<String>, String> {
    if answer.status != "success" {
        return Err(answer.status);
    }
    let mut out: Vec<String> = answer
        .data
        .map(|d| d.alerts)
        .unwrap_or_default()
        .into_iter()
        .filter(|a| a.state == "firing")
        .map(|a| a.labels.get("alertname").cloned().unwrap_or_default())
        .collect();
    out.sort();
    out.dedup();
    Ok(out)
}

/// The firing alerts that hold a reboot: all but those `ignored` matches.
pub fn blocking(firing: Vec<String>, ignored: Option<&regex::Regex>) -> Vec<String> {
    firing
        .into_iter()
        .filter(|n| ignored.is_none_or(|r| !r.is_match(n)))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_firing_alerts_count_and_ignored_ones_do_not_block() {
        let answer: Answer = serde_json::from_str(
            r#"{"status":"success","data":{"alerts":[
                {"labels":{"alertname":"Watchdog"},"state":"firing"},
                {"labels":{"alertname":"DiskFull","instance":"a"},"state":"firing"},
                {"labels":{"alertname":"DiskFull","instance":"b"},"state":"firing"},
                {"labels":{"alertname":"CPUHigh"},"state":"pending"}]}}"#,
        )
        .unwrap();
        let firing = names(answer).unwrap();
        assert_eq!(firing, ["DiskFull", "Watchdog"]);
        let ignored = regex::Regex::new("^Watchdog$").unwrap();
        assert_eq!(blocking(firing.clone(), Some(&ignored)), ["DiskFull"]);
        assert_eq!(blocking(firing, None), ["DiskFull", "Watchdog"]);
    }

    #[test]
    fn an_error_status_is_an_error() {
        let answer: Answer = serde_json::from_str(r#"{"status":"error"}"#).unwrap();
        assert_eq!(names(answer), Err("error".to_string()));
    }
}
