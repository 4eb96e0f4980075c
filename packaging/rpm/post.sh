# nodeward %post.  $1 = number of nodeward packages installed after this one: 1 = first install,
# 2 = upgrade. On a first install enable the agent and the drain unit (cloud-init also runs
# `systemctl enable --now`), and start them if systemd is running. On upgrade the old package's
# %postun try-restarts the agent, and nodeward-drain.service is never stopped or restarted by an
# upgrade, because stopping it runs a drain; only what is enabled but not running is started here
# (an agent an admin stopped by hand; the drain unit: start only arms it).
# Always, with systemd running: SIGHUP makes a running logind read the vendor drop-in
# (InhibitDelayMaxSec) now, so its cap is raised before the agent first runs (logind reloads on
# SIGHUP since systemd 230; `systemctl kill` signals its main process only).
if [ -d /run/systemd/system ]; then
    systemctl kill --kill-who=main --signal=SIGHUP systemd-logind.service >/dev/null 2>&1 || :
fi
if [ "$1" -eq 1 ]; then
    systemctl --no-reload enable nodeward.service nodeward-drain.service >/dev/null 2>&1 || :
    if [ -d /run/systemd/system ]; then
        systemctl daemon-reload >/dev/null 2>&1 || :
        systemctl start nodeward.service nodeward-drain.service >/dev/null 2>&1 || :
    fi
elif [ -d /run/systemd/system ]; then
    for unit in nodeward.service nodeward-drain.service; do
        if systemctl --quiet is-enabled "$unit" 2>/dev/null && ! systemctl --quiet is-active "$unit" 2>/dev/null; then
            systemctl start "$unit" >/dev/null 2>&1 || :
        fi
    done
fi
