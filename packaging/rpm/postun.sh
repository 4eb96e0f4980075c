# nodeward %postun.  $1 = 0: erased; $1 >= 1: upgraded (this runs from the OLD package, after the new
# one is in place). Reload systemd; on upgrade restart the agent if it was running (an agent restart
# is never a drain). nodeward-drain.service is left alone.
if [ -d /run/systemd/system ]; then
    systemctl daemon-reload >/dev/null 2>&1 || :
    if [ "$1" -ge 1 ]; then
        systemctl try-restart nodeward.service >/dev/null 2>&1 || :
    fi
fi
