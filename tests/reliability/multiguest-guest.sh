# Runs in each guest of tests/reliability/run-multiguest (bash, cwd = the shared results
# directory): the scenarios in order, this guest's role in each (guest 1 the server,
# guest 2 the client, guest 3 (three-guest boot) client3), once per transport in
# MG_TRANSPORTS: "rxe" on rxe0 as the guest booted, then "iwarp" on siw0, which takes
# rxe0's place on the same NIC and address (both on it would serve the same address), with
# its files under iwarp/. Per scenario: <s>.<role>.log, <s>.<role>.rc, <s>.<role>.seconds.
# Environment: MG_INDEX (rpmapp-multiguest), MG_SCENARIOS (the binary), MG_LIST (names),
# MG_TRANSPORTS (default "rxe").
case "$MG_INDEX" in
    1) role=server ;;
    3) role=client3 ;;
    *) role=client ;;
esac
# guest time; in e guest 3's clock was seen running up to 6 times fast (the host's
# RPMAPP_MULTIGUEST3_TIMEOUT bounds the boot in host time)
declare -A bound=([a]=150 [b]=90 [c]=90 [d]=120 [e]=1200)
run_list() {
    local s t0 t1 rc
    for s in $MG_LIST; do
        t0=$EPOCHREALTIME
        # live through tee: the host stamps each line when it happens
        timeout -k 5 "${bound[$s]}" "$MG_SCENARIOS" "$s" "$role" 2>&1 | tee "$s.$role.log"
        rc=${PIPESTATUS[0]}
        t1=$EPOCHREALTIME
        echo "$rc" > "$s.$role.rc"
        printf '%d\n' $(( (${t1/./} - ${t0/./}) / 1000000 )) > "$s.$role.seconds"
        [ "$rc" = 124 ] && echo "FAIL $s $role: timed out after ${bound[$s]} s"
    done
}
for transport in ${MG_TRANSPORTS:-rxe}; do
    case "$transport" in
        rxe) (run_list) ;;
        iwarp)
            # rxe0's users are gone: every scenario of the list above ended on both sides
            if ! { rdma link delete rxe0 && rdma link add siw0 type siw netdev "$SOFTROCE_NETDEV"; }; then
                echo "FAIL: cannot put siw0 in rxe0's place on $SOFTROCE_NETDEV"
                exit 1
            fi
            echo "siw0 on $SOFTROCE_NETDEV ($SOFTROCE_IP) in rxe0's place"
            mkdir -p iwarp && (cd iwarp && SOFTROCE_DEV=siw0 run_list) ;;
        *) echo "FAIL: unknown transport $transport"; exit 1 ;;
    esac
done
exit 0
