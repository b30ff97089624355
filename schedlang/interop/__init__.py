"""Round trips with TVM's own formats: traces, and MetaSchedule's JSON database.

    traces.py     a schedule's TVM trace and its JSON (`to_trace`, `trace_to_json`)
    decompiler.py a trace read back as schedlang (`from_trace`, `decompile`)
    database.py   MetaSchedule databases: export records, import the best one

Importing this package imports TVM.
"""

from schedlang.interop.database import (
    RECORD_FILE,
    WORKLOAD_FILE,
    ExportedRecord,
    MetaScheduleRecord,
    best_metaschedule_record,
    export_best,
    export_metaschedule,
    from_metaschedule,
    import_metaschedule,
    open_metaschedule,
    workload,
)
from schedlang.interop.decompiler import (
    BOOKKEEPING_HINTS,
    IMPORTED,
    SUPPORTED_INSTRUCTIONS,
    Decompiled,
    decompile,
    from_trace,
)
from schedlang.interop.traces import (
    require_traceable,
    to_trace,
    trace_from_json,
    trace_to_json,
    without_hints,
)

__all__ = [
    "BOOKKEEPING_HINTS",
    "IMPORTED",
    "RECORD_FILE",
    "SUPPORTED_INSTRUCTIONS",
    "WORKLOAD_FILE",
    "Decompiled",
    "ExportedRecord",
    "MetaScheduleRecord",
    "best_metaschedule_record",
    "decompile",
    "export_best",
    "export_metaschedule",
    "from_metaschedule",
    "from_trace",
    "import_metaschedule",
    "open_metaschedule",
    "require_traceable",
    "to_trace",
    "trace_from_json",
    "trace_to_json",
    "without_hints",
    "workload",
]
