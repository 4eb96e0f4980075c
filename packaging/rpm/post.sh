# nodeward %post.  $1 = number of nodeward packages installed after this one: 1 = first install,
# 2 = upgrade. On a first install enable the agent and the drain unit (cloud-init also runs
# `systemctl enable --now`), and start them if systemd is running. On upgrade do nothing here: the old
# package's %postun try-restarts the agent, and nodeward-drain.service is never stopped or restarted
# by an upgrade, because stopping it runs a drain.
if [ "$1" -eq 1 ]; then
    systemctl --no-reload enable nodeward.service nodeward-drain.service >/dev/null 2>&1 || :
    if [ -d /run/systemd/system ]; then
        systemctl daemon-reload >/dev/null 2>&1 || :
        systemctl start nodeward.service nodeward-drain.service >/dev/null 2>&1 || :
    fi
fi
