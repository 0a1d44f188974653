"""Horovod's HOROVOD_* variables as hora.init() translates them (hora/_horovod_env.py): each
value, unit and default against Horovod 0.28's reading of it, malformed values and
contradictions refused naming the variables, and the warnings. Pure functions of a dict: no
collective (horovod_env_check.py runs a real program with them)."""
import pytest

from hora import _horovod_env as H
import hora


def tr(**env):
    out, notes = H.translate(env)
    return {k: v for k, (v, _src) in out.items()}, notes


def test_each_variable_becomes_its_hora_setting():
    got, notes = tr(HOROVOD_FUSION_THRESHOLD="67108864", HOROVOD_CYCLE_TIME="3.5",
                    HOROVOD_CACHE_CAPACITY="0", HOROVOD_STALL_CHECK_TIME_SECONDS="120",
                    HOROVOD_STALL_SHUTDOWN_TIME_SECONDS="600", HOROVOD_LOG_LEVEL="DEBUG")
    assert got == {"HORA_FUSION_THRESHOLD": "67108864", "HORA_CYCLE_TIME_MS": "3.5",
                   "HORA_CACHE_CAPACITY": "0", "HORA_STALL_WARNING_S": "120",
                   "HORA_STALL_SHUTDOWN_S": "600", "HORA_LOG": "TRACE"}
    assert notes == []
    assert tr(HOROVOD_FUSION_THRESHOLD="0")[0] == {"HORA_FUSION_THRESHOLD": "0"}  # fusion off
    assert tr(HOROVOD_CYCLE_TIME=" 1 ")[0] == {"HORA_CYCLE_TIME_MS": "1.0"}
    assert tr()[0] == {} and tr(PATH="/bin")[0] == {}


def test_log_levels():
    want = {"trace": "TRACE", "debug": "TRACE", "info": "INFO", "warning": "WARN",
            "error": "WARN", "FATAL": "WARN"}
    for lv, hl in want.items():
        assert tr(HOROVOD_LOG_LEVEL=lv)[0] == {"HORA_LOG": hl}
    with pytest.raises(ValueError, match=r"HOROVOD_LOG_LEVEL='verbose'.*trace, debug"):
        tr(HOROVOD_LOG_LEVEL="verbose")


def test_timeline_path_dynamic_and_mark_cycles():
    assert tr(HOROVOD_TIMELINE="/x/t.json")[0] == {"HORA_TIMELINE": "/x/t.json",
                                                   "HORA_TIMELINE_MARK_CYCLES": "0"}
    assert tr(HOROVOD_TIMELINE="t.json", HOROVOD_TIMELINE_MARK_CYCLES="1")[0] == {
        "HORA_TIMELINE": "t.json", "HORA_TIMELINE_MARK_CYCLES": "1"}
    for v in ("DYNAMIC", "DISABLED", ""):  # start_timeline needs no switch in hora
        assert tr(HOROVOD_TIMELINE=v, HOROVOD_TIMELINE_MARK_CYCLES="1")[0] == {}
    # Horovod's default (no marks) gives way to a HORA_TIMELINE_MARK_CYCLES the user set...
    assert tr(HOROVOD_TIMELINE="t.json", HORA_TIMELINE_MARK_CYCLES="1")[0] == {
        "HORA_TIMELINE": "t.json"}
    # ...an explicit HOROVOD_TIMELINE_MARK_CYCLES does not.
    with pytest.raises(ValueError, match="HORA_TIMELINE_MARK_CYCLES"):
        H.apply({"HOROVOD_TIMELINE": "t.json", "HOROVOD_TIMELINE_MARK_CYCLES": "0",
                 "HORA_TIMELINE_MARK_CYCLES": "1"})


def test_stall_check_disable_wins():
    assert tr(HOROVOD_STALL_CHECK_DISABLE="1", HOROVOD_STALL_CHECK_TIME_SECONDS="5",
              HOROVOD_STALL_SHUTDOWN_TIME_SECONDS="9")[0] == {
        "HORA_STALL_WARNING_S": "0", "HORA_STALL_SHUTDOWN_S": "0"}
    # Horovod's flags count only when > 0.
    assert tr(HOROVOD_STALL_CHECK_DISABLE="0", HOROVOD_STALL_CHECK_TIME_SECONDS="5")[0] == {
        "HORA_STALL_WARNING_S": "5"}


@pytest.mark.parametrize("var,value", [
    ("HOROVOD_FUSION_THRESHOLD", "64MB"), ("HOROVOD_FUSION_THRESHOLD", "-1"),
    ("HOROVOD_FUSION_THRESHOLD", "1.5"), ("HOROVOD_CYCLE_TIME", "fast"),
    ("HOROVOD_CYCLE_TIME", "-2"), ("HOROVOD_CYCLE_TIME", "inf"),
    ("HOROVOD_CACHE_CAPACITY", ""), ("HOROVOD_STALL_CHECK_TIME_SECONDS", "1m"),
    ("HOROVOD_STALL_CHECK_DISABLE", "yes"), ("HOROVOD_AUTOTUNE", "true"),
])
def test_malformed_values_are_refused_naming_the_variable(var, value):
    # Horovod's strtol would read "64MB" as 64 and "yes" as 0, silently.
    with pytest.raises(hora.InvalidArgumentError) as e:
        tr(**{var: value})
    assert isinstance(e.value, ValueError) and f"{var}={value!r}" in str(e.value)


def test_apply_writes_hora_settings_and_refuses_contradictions():
    env = {"HOROVOD_FUSION_THRESHOLD": "1048576", "HOROVOD_CYCLE_TIME": "2"}
    assert H.apply(env) == []
    assert env["HORA_FUSION_THRESHOLD"] == "1048576" and env["HORA_CYCLE_TIME_MS"] == "2.0"
    # The same setting spelled hora's way is kept as the user wrote it.
    env = {"HOROVOD_FUSION_THRESHOLD": "1048576", "HORA_FUSION_THRESHOLD": "1M",
           "HOROVOD_CYCLE_TIME": "2", "HORA_CYCLE_TIME_MS": "2"}
    H.apply(env)
    assert env["HORA_FUSION_THRESHOLD"] == "1M" and env["HORA_CYCLE_TIME_MS"] == "2"
    env = {"HOROVOD_FUSION_THRESHOLD": "1048576", "HORA_FUSION_THRESHOLD": "2M"}
    with pytest.raises(hora.InvalidArgumentError,
                       match=r"HOROVOD_FUSION_THRESHOLD asks for HORA_FUSION_THRESHOLD=1048576, "
                             r"but HORA_FUSION_THRESHOLD=2M is set"):
        H.apply(env)
    assert env["HORA_FUSION_THRESHOLD"] == "2M"  # nothing changed
    with pytest.raises(ValueError, match="HORA_TIMELINE=b.json"):
        H.apply({"HOROVOD_TIMELINE": "a.json", "HORA_TIMELINE": "b.json"})


def test_warnings_for_requests_hora_cannot_honour():
    _, notes = tr(HOROVOD_AUTOTUNE="1", HOROVOD_MPI_THREADS_DISABLE="1",
                  HOROVOD_CPU_OPERATIONS="gloo", HOROVOD_CONTROLLER="MPI",
                  HOROVOD_HIERARCHICAL_ALLREDUCE="1", HOROVOD_NUM_NCCL_STREAMS="2")
    assert len(notes) == 3
    assert "HOROVOD_AUTOTUNE" in notes[0] and "no autotuner" in notes[0]
    assert "HOROVOD_MPI_THREADS_DISABLE" in notes[1] and "MPI_THREAD_MULTIPLE" in notes[1]
    assert "HOROVOD_CPU_OPERATIONS=gloo" in notes[2]
    assert tr(HOROVOD_AUTOTUNE="0")[1] == []
    with pytest.warns(UserWarning, match="hora: HOROVOD_AUTOTUNE"):
        H.warn(notes[:1], 0)
    import warnings
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        H.warn(notes, 1)  # other ranks stay quiet
