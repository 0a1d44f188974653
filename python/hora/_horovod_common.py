"""Horovod's framework-independent modules under hora's name, for programs whose imports were
changed from horovod to hora: `from hora.common.exceptions import HorovodInternalError` and
`from hora.common.process_sets import ProcessSet, add_process_set` (Horovod 0.28's
horovod/common/exceptions.py and process_sets.py). They are module objects registered in
sys.modules, as hora.torch's submodules are, holding the names of Horovod's module that hora has;
hora keeps its sources in one flat package."""
import sys
import types


def _module(name, doc, names):
    mod = types.ModuleType(name, doc)
    mod.__dict__.update(names)
    mod.__all__ = sorted(names)
    sys.modules[name] = mod
    return mod


def install(pkg):
    """Register hora.common, hora.common.exceptions and hora.common.process_sets; pkg is the
    hora package module (hora.common becomes its attribute)."""
    from ._errors import HorovodInternalError
    from ._torch_psets import (ProcessSet, add_process_set, global_process_set,
                               remove_process_set)
    exceptions = {"HorovodInternalError": HorovodInternalError}
    try:  # with libhora's elastic state only (hora.elastic)
        from ._torch_elastic import HostsUpdatedInterrupt
        exceptions["HostsUpdatedInterrupt"] = HostsUpdatedInterrupt
    except ImportError:
        pass
    common = _module(pkg.__name__ + ".common", "Horovod's horovod.common, as far as hora has it.",
                     {})
    common.exceptions = _module(common.__name__ + ".exceptions",
                                "Horovod's horovod.common.exceptions.", exceptions)
    common.process_sets = _module(common.__name__ + ".process_sets",
                                  "Horovod's horovod.common.process_sets.",
                                  {"ProcessSet": ProcessSet,
                                   "global_process_set": global_process_set,
                                   "add_process_set": add_process_set,
                                   "remove_process_set": remove_process_set})
    common.__path__ = []  # a package: `import hora.common.exceptions` looks in sys.modules
    pkg.common = common
