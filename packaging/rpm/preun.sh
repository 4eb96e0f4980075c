# nodeward %preun.  $1 = 0: the package is being erased; $1 >= 1: this is the old package's half of an
# upgrade, and nothing is stopped (nodeward-drain.service stays armed; stopping it would drain).
# On erase: disable both units, stop the agent, and stop nodeward-drain.service WITHOUT draining:
# `nodeward drain` (its ExecStop) returns at once, doing nothing, while /run/nodeward/no-drain exists.
# Erasing the package is not a decision to drain the node; run `systemctl stop nodeward-drain` first
# for that.
if [ "$1" -eq 0 ]; then
    systemctl --no-reload disable nodeward.service nodeward-drain.service >/dev/null 2>&1 || :
    if [ -d /run/systemd/system ]; then
        systemctl stop nodeward.service >/dev/null 2>&1 || :
        mkdir -p /run/nodeward
        : > /run/nodeward/no-drain
        systemctl stop nodeward-drain.service >/dev/null 2>&1 || :
        rm -f /run/nodeward/no-drain
        rmdir /run/nodeward 2>/dev/null || :
    fi
fi
