"""The wire format: envelopes as msgpack frames, checked strictly on the way in.

Every frame is one msgpack array ``[VERSION, kind, src, dst, view, inc,
dst_inc, *fields]``. Decoding never trusts the peer (DESIGN 4.4): a
frame that is not msgpack, is truncated, too large, of an unknown kind or of
the wrong shape raises ``WireError`` with a reason a log line can name, and
nothing half-decoded escapes. Records inside batches are any msgpack value;
tuples come back as lists (DESIGN 4.1).

A batch's fields come in one of two forms, told apart by the first field:

- records form ``[width, conn SN bytes, [record, ...], bound, cut]``: each item's
  payload is one plain record;
- rows form ``["rows", width, conn SN bytes, [[rows, sn_width, SN bytes, records],
  ...], bound, cut]``: each item's payload is an ``exchange.rows.Rows`` in its
  ``to_state`` layout, its SN matrix decoded as a read-only view of the frame's bytes;
  Arrow IPC bytes in place of the records list are a columnar item
  (``exchange.columns.ArrowRows``).

Conn SN bytes are every item's connection SN, ``width`` little-endian int64s each.
"""
from __future__ import annotations

import sys
from array import array
from itertools import chain
from typing import Any, Callable, Dict, List, Tuple

import msgpack
import numpy as np

from exchange.group_map import GroupMove
from exchange.rows import NumberedRows, Rows
from flux.addresses import Addr, MoverAddr, ProcAddr
from flux.digests import GROUPS, Digest
from flux.keys import tuplify
from flux.control_messages import (
    Avail,
    Joined,
    CatchUpPaused,
    Failed,
    FoldedIn,
    Heartbeat,
    Members,
    NodeStats,
    OperatorFailed,
    Ready,
    Register,
    SegmentStats,
    SnapshotWritten,
    CutDigest,
    ProbedKeys,
    ProbeKeys,
    StateMoved,
    Stop,
    Stopping,
    TakeoverDone,
    View,
    Welcome,
    SinkCommitted,
    WriterMove,
    WriterProgress,
    IngressEnded,
    CheckpointDone,
    CutAtEpoch,
    HoldInputs,
    SplitCutPassed,
    InstallRange,
    RangeInstalled,
    RangePacked,
)
from flux.data_messages import (
    Ack,
    Batch,
    Credit,
    CSync,
    IngressLog,
    LogAck,
    Pause,
    PauseAck,
    PSync,
    Restore,
    Restored,
    Reverse,
    Stay,
)
from flux.envelope import Envelope
from statemover.messages import (
    Abort,
    Chunk,
    Handshake,
    LinkLost,
    Nack,
    PartAck,
    PartTrailer,
    Role,
    StateAck,
    Trailer,
    TransferFailed,
)

#: 2: a batch's tuples travel as columns (``_put_batch_items``); 3: or as Rows (rows form);
#: 4: the StateMover numbers its chunks and trailers and asks for lost ones again
VERSION = 4
#: the first field of a batch in rows form (the records form's is its SN length, an int)
ROWS_FORM = "rows"
#: SNs longer than this are refused: an SN has one int per stage a record went through
MAX_SN_LENGTH = 256
_BIG_ENDIAN = sys.byteorder == "big"
#: the last batch's tuples encoded, and their fields packed: a batch a producer sends to both
#: replicas of a pair is one tuple object (Buffer.take), packed once
_last_encoded: tuple = (None, (0, b""))
#: frames above this are refused before decoding (a state chunk is 1 MiB by default)
MAX_FRAME = 64 << 20


class WireError(ValueError):
    """A frame that cannot be a message of this protocol."""


# -- field checks ----------------------------------------------------------------

def _int(v, what: str) -> int:
    if type(v) is not int:
        raise WireError(f"{what} must be an int, got {type(v).__name__}")
    return v


def _bool(v, what: str) -> bool:
    if type(v) is not bool:
        raise WireError(f"{what} must be a bool, got {type(v).__name__}")
    return v


def _seconds(v, what: str) -> float:
    if type(v) not in (int, float) or not v >= 0:
        raise WireError(f"{what} must be a number of seconds >= 0, got {v!r:.60}")
    return float(v)


def _sn(v, what: str = "SN") -> Tuple[int, ...]:
    if not isinstance(v, list) or not all(type(x) is int for x in v):
        raise WireError(f"{what} must be a list of ints, got {v!r:.60}")
    return tuple(v)


def _cut(v):
    """A checkpoint cut ``[k, n]``, or None; ``[k, n, move_cuts]`` with the live moves of
    key groups the producer tells (``flux.protocol.cuts``): ``[[k_i, n_i, [move, ...]],
    ...]``, each move ``[stage, first, last, source, dest]``."""
    if v is None:
        return None
    if not (isinstance(v, list) and len(v) in (2, 3)
            and all(type(x) is int and x >= 0 for x in v[:2])):
        raise WireError(f"a checkpoint cut must be [checkpoint, input], got {v!r:.60}")
    if len(v) == 2:
        return (v[0], v[1])
    return (v[0], v[1], tuple(_move_cut(c) for c in _list(v[2], "move cuts")))


def _move_cut(v) -> tuple:
    if not (isinstance(v, list) and len(v) == 3):
        _bad("move cut", v)
    return (_int(v[0], "move cut checkpoint"), _int(v[1], "move cut input"),
            tuple(_group_move(m) for m in _list(v[2], "moves")))


def _group_move(v) -> GroupMove:
    if not (isinstance(v, list) and len(v) in (5, 6) and
            all(type(x) is int and x >= 0 for x in v) and v[1] <= v[2]):
        raise WireError(f"a move is [stage, first, last, source, dest(, prepare)], got "
                        f"{v!r:.60}")
    return GroupMove.from_wire(v)


def _put_cut(cut) -> Any:
    if cut is None:
        return None
    if len(cut) == 2:
        return list(cut)
    return [cut[0], cut[1], [[k, n, [m.to_wire() for m in moves]] for k, n, moves in cut[2]]]


def _chain(v) -> tuple:
    """A snapshot's chain: ``[[checkpoint, file name], ...]``."""
    if not (isinstance(v, list) and all(
            isinstance(c, list) and len(c) == 2 and type(c[0]) is int and c[0] >= 0
            and isinstance(c[1], str) for c in v)):
        raise WireError(f"a snapshot chain must be [[checkpoint, name], ...], got {v!r:.60}")
    return tuple((k, name) for k, name in v)


def _endpoint(v, what: str):
    if isinstance(v, list) and len(v) == 2 and v[0] in ("sm", "proc") and isinstance(v[1], str):
        return MoverAddr(v[1]) if v[0] == "sm" else ProcAddr(v[1])
    if isinstance(v, list) and len(v) == 3 and all(type(x) is int for x in v):
        if v[2] not in (0, 1):
            raise WireError(f"{what}: replica must be 0 or 1, got {v[2]}")
        return Addr(*v)
    raise WireError(f"{what} must be [stage, partition, replica], [\"sm\", node] or "
                    f"[\"proc\", name], got {v!r:.60}")


def _put_endpoint(e) -> Any:
    if isinstance(e, MoverAddr):
        return ["sm", e.node]
    if isinstance(e, ProcAddr):
        return ["proc", e.name]
    return list(e)


def _addr(v, what: str) -> Addr:
    e = _endpoint(v, what)
    if not isinstance(e, Addr):
        raise WireError(f"{what} must be a segment address, got {v!r:.60}")
    return e


def _list(v, what: str) -> list:
    if not isinstance(v, list):
        raise WireError(f"{what} must be a list, got {type(v).__name__}")
    return v


def _avail(v) -> Avail:
    if not isinstance(v, list) or len(v) != 5:
        raise WireError(f"an avail is [addr, inc, version, node, active_node], got {v!r:.60}")
    return Avail(_addr(v[0], "avail addr"), _int(v[1], "avail inc"), _int(v[2], "avail version"),
                 _str(v[3], "avail node"), _str(v[4], "avail active node"))


def _writer_move(v) -> WriterMove:
    if not isinstance(v, list) or len(v) != 3:
        raise WireError(f"a writer move is [addr, inc, node], got {v!r:.60}")
    return WriterMove(_addr(v[0], "writer addr"), _int(v[1], "writer inc"),
                      _str(v[2], "writer node"))


def _joined(v) -> Joined:
    if not isinstance(v, list) or len(v) != 6:
        raise WireError(f"a join is [addr, inc, node, groups, moves seen, cut], got {v!r:.60}")
    groups = tuple((_int(g[0], "joined map stage"), _sn(g[1], "joined map owners"))
                   if isinstance(g, list) and len(g) == 2 else _bad("joined map", g)
                   for g in _list(v[3], "joined maps"))
    return Joined(_addr(v[0], "joined addr"), _int(v[1], "joined inc"),
                  _str(v[2], "joined node"), groups, _int(v[4], "joined moves seen"),
                  _sn(v[5], "joined cut"))


def _view(number, failed, failed_incs, avail, writers, joined, left, left_cut) -> View:
    return View(_int(number, "view number"),
                frozenset(_endpoint(a, "failed endpoint") for a in _list(failed, "failed")),
                frozenset(_int(i, "failed inc") for i in _list(failed_incs, "failed incs")),
                tuple(_avail(a) for a in _list(avail, "avail")),
                tuple(_writer_move(w) for w in _list(writers, "writers")),
                tuple(_joined(j) for j in _list(joined, "joined")),
                tuple(_addr(a, "left addr") for a in _list(left, "left")),
                _sn(left_cut, "left cut"))


def _digest_groups(v) -> tuple:
    groups = _list(v, "digest groups")
    if len(groups) != GROUPS:
        _bad("digest groups", v)
    return tuple(_int(x, "group digest") for x in groups)


def _probed_pair(v) -> tuple:
    """``[key, pair digest]``: the key any msgpack value (as a checkpoint holds it)."""
    pair = _list(v, "probed pair")
    if len(pair) != 2:
        _bad("probed pair", v)
    return tuplify(pair[0]), _int(pair[1], "pair digest")  # a key's tuples came as lists


def _opt_int(v, what: str):
    return None if v is None else _int(v, what)


def _bytes(v, what: str) -> bytes:
    if not isinstance(v, bytes):
        raise WireError(f"{what} must be bytes, got {type(v).__name__}")
    return v


def _transfer(v) -> tuple:
    if not isinstance(v, list) or len(v) != 3 or not all(type(x) is int for x in v):
        raise WireError(f"transfer id must be [stage, partition, version], got {v!r:.60}")
    return tuple(v)


def _put_batch_items(items) -> list:
    """A batch's items in records or rows form (the first item's payload says which).
    Built and read in C (the per-tuple lists cost ~0.7 us a tuple to check and convert)."""
    if not items:
        return [0, b"", []]
    conn_sns, payloads = zip(*items)
    if isinstance(payloads[0], NumberedRows):
        return [ROWS_FORM, *_put_sns(conn_sns), _put_rows(payloads)]
    return [*_put_sns(conn_sns), list(payloads)]


def _packed_items(items) -> Tuple[int, bytes]:
    """A batch's item fields packed: how many, and their msgpack bytes (without a list's
    header). The same tuples object goes to both replicas of a pair (Buffer.take): it
    is packed once, the records in it the bulk of the frame."""
    global _last_encoded
    last = _last_encoded  # one read: other threads may replace it meanwhile
    if last[0] is items:
        return last[1]
    fields = _put_batch_items(items)
    packed = (len(fields), msgpack.packb(fields, use_bin_type=True, default=_no_rows)[1:])
    _last_encoded = (items, packed)  # holds ``items``: its identity is not reused meanwhile
    return packed


def _put_sns(sns) -> list:
    """The SN length and every SN's ints packed as little-endian int64s: all SNs of a
    batch have one length (DESIGN 4.1)."""
    width = len(sns[0])
    if width < 1 or len(set(map(len, sns))) != 1:
        raise ValueError(f"the SNs of one batch must have one length >= 1 (DESIGN 4.1), "
                         f"got lengths {sorted(set(map(len, sns)))}")
    flat = array("q", chain.from_iterable(sns))
    if _BIG_ENDIAN:
        flat.byteswap()
    return [width, flat.tobytes()]


_MIXED = "a batch's items are all Rows or all plain records, never a mix (no Rows in a record)"


def _put_rows(payloads) -> list:
    """Every item's Rows as ``Rows.to_state``: the SN matrix as raw bytes, the records
    as one list. A rows-form batch holds nothing else."""
    if not all(isinstance(p, NumberedRows) for p in payloads):
        raise ValueError(_MIXED)
    return [p.to_state() for p in payloads]


def _no_rows(obj):
    """msgpack's hook for a value it cannot pack. A Rows there sat among a batch's plain
    records: msgpack finds it at no cost, where a scan would take ~27 us per 1024
    records of every batch."""
    if isinstance(obj, NumberedRows):
        raise ValueError(_MIXED)
    raise TypeError(f"can not serialize {type(obj).__name__!r} object")


def _sn_column(width, data, count: int, noun: str):
    """``count`` SN tuples of ``width`` ints from their little-endian int64 bytes."""
    if type(width) is not int or not 0 <= width <= MAX_SN_LENGTH:
        raise WireError(f"batch SN length must be an int in 0..{MAX_SN_LENGTH}, "
                        f"got {width!r:.20}")
    if len(data) != 8 * width * count or (count and not width):
        raise WireError(f"batch of {count} {noun} has {len(data)} bytes of SNs "
                        f"of length {width}")
    flat = array("q")
    flat.frombytes(data)
    if _BIG_ENDIAN:
        flat.byteswap()
    return zip(*[iter(flat)] * width)  # consecutive ``width`` ints: one SN tuple


def _batch_items(width, data, records) -> tuple:
    """A records-form batch's items: per record its conn SN."""
    if not isinstance(data, bytes) or not isinstance(records, list):
        raise WireError("batch items must be SN bytes and a list of records")
    return tuple(zip(_sn_column(width, data, len(records), "records"), records))


def _rows_items(width, data, entries) -> tuple:
    """A rows-form batch's items: per Rows its conn SN."""
    if not isinstance(data, bytes) or not isinstance(entries, list):
        raise WireError("batch items must be SN bytes and a list of rows")
    return tuple(zip(_sn_column(width, data, len(entries), "items"), map(_rows, entries)))


def _rows_shape(n, width) -> None:
    """An item's row count and SN length: ints, neither negative nor absurd."""
    if type(n) is not int or n < 0:
        raise WireError(f"an item's row count must be an int >= 0, got {n!r:.20}")
    if type(width) is not int or not 0 <= width <= MAX_SN_LENGTH:
        raise WireError(f"an item's SN length must be an int in 0..{MAX_SN_LENGTH}, "
                        f"got {width!r:.20}")
    if n and not width:
        raise WireError(f"an item of {n} rows has SNs of length 0")


def _rows(entry) -> NumberedRows:
    """One item's rows from their ``to_state`` form, checked before anything is built;
    the SN matrix is a read-only view of the frame's bytes, not a copy."""
    if not isinstance(entry, list) or len(entry) != 4:
        raise WireError(f"an item's rows are [rows, width, SN bytes, records], "
                        f"got {entry!r:.60}")
    n, width, raw, records = entry
    _rows_shape(n, width)
    columnar = isinstance(records, bytes)
    if not isinstance(raw, bytes) or not (columnar or isinstance(records, list)):
        raise WireError("an item's rows must be SN bytes and a list of records "
                        "or Arrow IPC bytes")
    if not columnar and len(records) != n:
        raise WireError(f"an item of {n} rows has {len(records)} records")
    if len(raw) != 8 * n * width:
        raise WireError(f"an item of {n} rows has {len(raw)} bytes of SNs of length {width}")
    sns = np.frombuffer(raw, dtype="<i8").reshape(n, width)
    if _BIG_ENDIAN:
        sns = sns.astype(np.int64)
    if columnar:
        return _columns(sns, records)
    return Rows(sns, records)


def _columns(sns: np.ndarray, ipc: bytes) -> NumberedRows:
    """A columnar item: its batch from Arrow IPC, checked (pyarrow only where one comes)."""
    from exchange.columns import ArrowRows, ColumnsError, from_ipc
    try:
        return ArrowRows(sns, from_ipc(ipc, sns.shape[0]))
    except ColumnsError as exc:
        raise WireError(str(exc)) from None


def _segment_stats(v) -> tuple:
    if not isinstance(v, list):
        raise WireError(f"node stats must be a list, got {type(v).__name__}")
    out = []
    for row in v:
        if not isinstance(row, list) or len(row) != 10:
            raise WireError(f"a segment's stats must be 10 fields, got {row!r:.60}")
        if not isinstance(row[7], list):
            raise WireError(f"a segment's rows per key group must be a list, got "
                            f"{type(row[7]).__name__}")
        if not isinstance(row[9], bool):
            raise WireError(f"a segment's idle must be a bool, got {type(row[9]).__name__}")
        out.append(SegmentStats(_addr(row[0], "addr"), *(_int(x, "counter") for x in row[1:7]),
                                tuple(_int(x, "counter") for x in row[7]),
                                _int(row[8], "move cut"), row[9]))
    return tuple(out)


# -- the message table: kind -> (class, encode fields, decode fields) ----------------

_Codec = Tuple[type, Callable[[Any], List], Callable[[List], Any]]


def _arity(n: int, f: Callable[..., Any]) -> Callable[[List], Any]:
    def decode(fields: List):
        if len(fields) != n:
            raise WireError(f"expected {n} fields, got {len(fields)}")
        return f(*fields)
    return decode


_records_batch = _arity(5, lambda width, sns, records, bound, cut: Batch(
    _batch_items(width, sns, records), _sn(bound, "bound"), _cut(cut)))
_rows_batch = _arity(6, lambda _form, width, sns, rows, bound, cut: Batch(
    _rows_items(width, sns, rows), _sn(bound, "bound"), _cut(cut)))


def _batch(fields: List) -> Batch:
    """A batch in either form: the rows form's first field is ROWS_FORM, the records
    form's is its SN length (an int)."""
    rows_form = bool(fields) and type(fields[0]) is str and fields[0] == ROWS_FORM
    return (_rows_batch if rows_form else _records_batch)(fields)


CODECS: Dict[str, _Codec] = {
    "batch": (Batch, lambda m: [*_put_batch_items(m.items), list(m.bound), _put_cut(m.cut)],
              _batch),
    "ack": (Ack, lambda m: [list(m.hwm), m.moves],
            _arity(2, lambda h, k: Ack(_sn(h, "hwm"), _opt_int(k, "moves crossed")))),
    "credit": (Credit, lambda m: [list(m.sn), m.moves],
               _arity(2, lambda sn, k: Credit(_sn(sn, "sn"), _opt_int(k, "moves crossed")))),
    "reverse": (Reverse, lambda m: [list(m.hwm), None if m.held is None else list(m.held)],
                _arity(2, lambda h, held: Reverse(_sn(h, "hwm"),
                                                  None if held is None else _sn(held, "held")))),
    "pause": (Pause, lambda m: [m.version], _arity(1, lambda v: Pause(_int(v, "version")))),
    "ingress_log": (IngressLog, lambda m: [m.first, [list(e) for e in m.entries]],
                    _arity(2, lambda first, entries: IngressLog(
                        _int(first, "first entry"), _log_entries(entries)))),
    "log_ack": (LogAck, lambda m: [m.upto], _arity(1, lambda n: LogAck(_int(n, "upto")))),
    "pause_ack": (PauseAck, lambda m: [m.version],
                  _arity(1, lambda v: PauseAck(_int(v, "version")))),
    "csync": (CSync, lambda m: [m.version], _arity(1, lambda v: CSync(_int(v, "version")))),
    "psync": (PSync, lambda m: [m.version, m.forwards],
              _arity(2, lambda v, f: PSync(_int(v, "version"), _bool(f, "forwards")))),
    "restore": (Restore, lambda m: [m.version], _arity(1, lambda v: Restore(_int(v, "version")))),
    "stay": (Stay, lambda m: [m.version], _arity(1, lambda v: Stay(_int(v, "version")))),
    "restored": (Restored, lambda m: [m.version],
                 _arity(1, lambda v: Restored(_int(v, "version")))),
    "sm_hello": (Handshake, lambda m: [list(m.transfer), Role(m.role).value],
                 _arity(2, lambda t, role: Handshake(_transfer(t), _role(role)))),
    "sm_chunk": (Chunk, lambda m: [list(m.transfer), m.index, bytes(m.data), m.seq],
                 _arity(4, lambda t, i, d, q: Chunk(_transfer(t), _int(i, "chunk index"),
                                                    _bytes(d, "chunk data"), _int(q, "seq")))),
    "sm_trailer": (Trailer, lambda m: [list(m.transfer), m.count, m.length, m.crc, m.seq],
                   _arity(5, lambda t, n, ln, crc, q: Trailer(
                       _transfer(t), _int(n, "count"), _int(ln, "length"), _int(crc, "crc"),
                       _int(q, "seq")))),
    "sm_part_trailer": (PartTrailer, lambda m: [list(m.transfer), m.part, m.count, m.length, m.crc,
                                                m.seq],
                        _arity(6, lambda t, p, n, ln, crc, q: PartTrailer(
                            _transfer(t), _int(p, "part"), _int(n, "count"), _int(ln, "length"),
                            _int(crc, "crc"), _int(q, "seq")))),
    "sm_part_ack": (PartAck, lambda m: [list(m.transfer), m.part],
                    _arity(2, lambda t, p: PartAck(_transfer(t), _int(p, "part")))),
    "sm_nack": (Nack, lambda m: [list(m.transfer), m.seq],
                _arity(2, lambda t, q: Nack(_transfer(t), _int(q, "seq")))),
    "sm_state_ack": (StateAck, lambda m: [list(m.transfer)],
                     _arity(1, lambda t: StateAck(_transfer(t)))),
    "sm_link_lost": (LinkLost, lambda m: [m.expected, m.got],
                     _arity(2, lambda e, g: LinkLost(_int(e, "expected"), _int(g, "got")))),
    "sm_abort": (Abort, lambda m: [list(m.transfer), m.reason],
                 _arity(2, lambda t, r: Abort(_transfer(t), _str(r, "reason")))),
    "transfer_failed": (TransferFailed, lambda m: [list(m.transfer), m.reason],
                        _arity(2, lambda t, r: TransferFailed(_transfer(t), _str(r, "reason")))),
    "view": (View, lambda m: [m.number, [_put_endpoint(a) for a in sorted(m.failed, key=str)],
                              sorted(m.failed_incs),
                              [[list(a.addr), a.inc, a.version, a.node, a.active_node]
                               for a in m.avail],
                              [[list(w.addr), w.inc, w.node] for w in m.writers],
                              [[list(j.addr), j.inc, j.node,
                                [[st, list(owners)] for st, owners in j.groups],
                                j.moves_seen, list(j.cut)] for j in m.joined],
                              [list(a) for a in m.left], list(m.left_cut)],
             _arity(8, _view)),
    "writer_progress": (WriterProgress, lambda m: [m.partition, list(m.bound), m.settled,
                                                   m.outputs],
                        _arity(4, lambda p, b, n, o: WriterProgress(
                            _int(p, "partition"), _sn(b, "bound"), _int(n, "settled"),
                            _int(o, "outputs")))),
    "ingress_ended": (IngressEnded, lambda m: [m.split, m.last, m.inputs],
                      _arity(3, lambda k, n, c: IngressEnded(
                          _int(k, "split"), _int(n, "last"), _int(c, "inputs")))),
    "checkpoint_done": (CheckpointDone, lambda m: [m.number, m.cut],
                        _arity(2, lambda k, c: CheckpointDone(_int(k, "checkpoint"),
                                                              _int(c, "cut")))),
    "cut_at_epoch": (CutAtEpoch, lambda m: [m.number, m.epoch,
                                            [mv.to_wire() for mv in m.moves]],
                     _arity(3, lambda k, e, mv: CutAtEpoch(
                         _int(k, "checkpoint"), _int(e, "epoch"),
                         tuple(_group_move(m) for m in _list(mv, "moves"))))),
    "hold_inputs": (HoldInputs, lambda m: [m.after_epoch],
                    _arity(1, lambda e: HoldInputs(_opt_int(e, "epoch")))),
    "split_cut_passed": (SplitCutPassed, lambda m: [m.number, m.cut, m.split, m.read,
                                                    m.mark],
                         _arity(5, lambda k, c, i, n, mark: SplitCutPassed(
                             _int(k, "checkpoint"), _int(c, "cut"), _int(i, "split"),
                             _int(n, "read"), _str(mark, "mark")))),
    "sink_committed": (SinkCommitted, lambda m: [m.number, None if m.sn is None else list(m.sn),
                                                 m.partition],
                       _arity(3, lambda k, sn, p: SinkCommitted(
                           _int(k, "checkpoint"), None if sn is None else _sn(sn),
                           _int(p, "partition")))),
    "node_stats": (NodeStats, lambda m: [[[list(x.addr), x.taken, x.emitted, x.queued, x.buffered,
                                           x.in_flight, x.blocked, list(x.routed),
                                           x.moves_crossed, x.idle]
                                          for x in m.segments]],
                   _arity(1, lambda segs: NodeStats(_segment_stats(segs)))),
    "heartbeat": (Heartbeat, lambda m: [m.lag, m.late],
                  _arity(2, lambda lag, late: Heartbeat(_seconds(lag, "lag"),
                                                        _seconds(late, "late")))),
    "folded_in": (FoldedIn, lambda m: [list(m.reporter), list(m.addr), m.version],
                  _arity(3, lambda r, a, v: FoldedIn(_addr(r, "reporter"), _addr(a, "addr"),
                                                     _int(v, "version")))),
    "takeover_done": (TakeoverDone, lambda m: [list(m.addr)],
                      _arity(1, lambda a: TakeoverDone(_addr(a, "addr")))),
    "state_moved": (StateMoved, lambda m: [list(m.addr), m.nbytes, m.seconds],
                    _arity(3, lambda a, n, t: StateMoved(_addr(a, "addr"), _int(n, "nbytes"),
                                                         _seconds(t, "seconds")))),
    "catchup_paused": (CatchUpPaused, lambda m: [list(m.addr), m.seconds],
                       _arity(2, lambda a, t: CatchUpPaused(_addr(a, "addr"),
                                                            _seconds(t, "seconds")))),
    "snapshot_written": (
        SnapshotWritten, lambda m: [m.number, list(m.addr), m.name, m.nbytes, m.seconds, m.error,
                                    [list(c) for c in m.chain], list(m.digests)],
        _arity(8, lambda k, a, n, b, t, e, c, d: SnapshotWritten(
            _int(k, "checkpoint"), _addr(a, "addr"), _str(n, "name"), _int(b, "nbytes"),
            _seconds(t, "seconds"), _str(e, "error"), _chain(c),
            tuple(_str(x, "digest") for x in _list(d, "digests"))))),
    "cut_digest": (
        CutDigest, lambda m: [list(m.addr), m.digest.number, m.digest.cut, list(m.digest.states),
                              m.digest.outputs, m.digest.since,
                              [None if g is None else list(g) for g in m.digest.groups]],
        _arity(7, lambda a, k, n, st, o, s, g: CutDigest(_addr(a, "addr"), Digest(
            _int(k, "checkpoint"), _int(n, "cut"),
            tuple(_int(x, "state digest") for x in _list(st, "state digests")),
            None if o is None else _int(o, "outputs digest"), _int(s, "since"),
            tuple(None if x is None else _digest_groups(x) for x in _list(g, "groups")))))),
    "probe_keys": (
        ProbeKeys, lambda m: [list(m.addr), m.number, m.cut, m.operator, list(m.groups)],
        _arity(5, lambda a, k, n, o, g: ProbeKeys(
            _addr(a, "addr"), _int(k, "checkpoint"), _int(n, "cut"), _int(o, "operator"),
            tuple(_int(x, "group") for x in _list(g, "groups"))))),
    "probed_keys": (
        ProbedKeys, lambda m: [list(m.addr), m.number, m.cut, m.operator,
                               None if m.pairs is None else [list(p) for p in m.pairs]],
        _arity(5, lambda a, k, n, o, p: ProbedKeys(
            _addr(a, "addr"), _int(k, "checkpoint"), _int(n, "cut"), _int(o, "operator"),
            None if p is None else tuple(_probed_pair(x) for x in _list(p, "pairs"))))),
    "range_packed": (
        RangePacked, lambda m: [m.number, m.move.to_wire(), list(m.addr), m.data, m.over,
                                m.took],
        _arity(6, lambda k, mv, a, d, o, t: RangePacked(
            _int(k, "checkpoint"), _group_move(mv), _addr(a, "addr"), _bytes(d, "range"),
            _opt_int(o, "bulk checkpoint"), _seconds(t, "took")))),
    "install_range": (
        InstallRange, lambda m: [m.number, m.move.to_wire(), m.data, m.over],
        _arity(4, lambda k, mv, d, o: InstallRange(_int(k, "checkpoint"), _group_move(mv),
                                                   _bytes(d, "range"), _opt_int(o, "bulk checkpoint")))),
    "range_installed": (
        RangeInstalled, lambda m: [m.number, m.move.to_wire(), list(m.addr), m.waited],
        _arity(4, lambda k, mv, a, t: RangeInstalled(_int(k, "checkpoint"), _group_move(mv),
                                                     _addr(a, "addr"), _seconds(t, "waited")))),
    "ready": (Ready, lambda m: [], _arity(0, Ready)),
    "register": (Register, lambda m: [m.task, m.inc, m.address, m.pid, m.executor_pid, m.secret,
                                      m.mover_address, m.host, m.executor, m.boot],
                 _arity(10, lambda t, i, a, p, e, s, ma, h, x, b: Register(
                     _int(t, "task"), _int(i, "inc"), _str(a, "address"), _int(p, "pid"),
                     _int(e, "executor pid"), _str(s, "secret"), _str(ma, "mover address"),
                     _str(h, "host"), _str(x, "executor"), _str(b, "boot")))),
    "welcome": (Welcome, lambda m: [m.name, m.view, [[list(a), n] for a, n in m.where],
                                    list(m.dead_incs), list(m.joined), list(m.left)],
                _arity(6, lambda n, v, w, d, j, lf: Welcome(
                    _str(n, "name"), _int(v, "view"),
                    tuple((_addr(x[0], "where addr") if isinstance(x, list) and len(x) == 2
                           else _bad("where entry", x), _str(x[1], "where name"))
                          for x in _list(w, "where")),
                    tuple(_int(i, "dead inc") for i in _list(d, "dead incs")),
                    tuple(_int(q, "joined partition") for q in _list(j, "joined")),
                    tuple(_int(q, "left partition") for q in _list(lf, "left"))))),
    "members": (Members, lambda m: [[list(x) for x in m.addresses]],
                _arity(1, lambda xs: Members(tuple(_member(x) for x in _list(xs, "members"))))),
    "stop": (Stop, lambda m: [m.reason], _arity(1, lambda r: Stop(_str(r, "reason")))),
    "stopping": (Stopping, lambda m: [m.reason],
                 _arity(1, lambda r: Stopping(_str(r, "reason")))),
    "operator_failed": (
        OperatorFailed, lambda m: [m.what, m.stage, m.partition, list(m.sn), m.error, m.secret],
        _arity(6, lambda w, st, p, sn, e, s: OperatorFailed(
            _str(w, "what"), _int(st, "stage"), _int(p, "partition"),
            tuple(_int(x, "sn part") for x in _list(sn, "sn")), _str(e, "error"),
            _str(s, "secret")))),
    "failed": (Failed, lambda m: [m.task, m.inc, m.reason, m.secret, m.fatal, list(m.corrupt)],
               _arity(6, lambda t, i, r, s, f, c: Failed(
                   _int(t, "task"), _int(i, "inc"), _str(r, "reason"), _str(s, "secret"),
                   bool(f), tuple(_str(x, "corrupt") for x in _list(c, "corrupt"))))),
}


def _bad(what: str, v):
    raise WireError(f"malformed {what}: {v!r:.60}")


def _member(v) -> tuple:
    if not isinstance(v, list) or len(v) != 3:
        raise WireError(f"a member is [name, address, inc], got {v!r:.60}")
    return (_str(v[0], "member name"), _str(v[1], "member address"), _int(v[2], "member inc"))
KIND_OF = {cls: kind for kind, (cls, _, _) in CODECS.items()}


def _role(v) -> Role:
    if not isinstance(v, str) or v not in ("send", "recv"):
        raise WireError(f"mover role must be 'send' or 'recv', got {v!r:.30}")
    return Role(v)


#: what an ingress's log entry says (flux.protocol.ingress_pair)
LOG_ENTRY_KINDS = ("item", "epoch", "cut")


def _log_entries(v) -> tuple:
    """An ingress's log entries: ``[kind, number]`` each, ``["cut", checkpoint, epoch]``
    for a checkpoint's cut, ``["cut", checkpoint, epoch, moves]`` for one carrying live
    moves of key groups (each in its wire form)."""
    if not isinstance(v, list):
        raise WireError(f"log entries must be a list, got {type(v).__name__}")
    entries = []
    for entry in v:
        if not (isinstance(entry, list) and entry and entry[0] in LOG_ENTRY_KINDS
                and len(entry) in ((3, 4) if entry[0] == "cut" else (2,))):
            raise WireError(f"a log entry must be [kind, number] (kind one of "
                            f"{LOG_ENTRY_KINDS[:2]}) or [\"cut\", checkpoint, epoch(, "
                            f"moves)], got {entry!r:.60}")
        entries.append((entry[0],) + tuple(_int(x, "log entry") for x in entry[1:3]) + (
            (tuple(_group_move(m).to_wire() for m in _list(entry[3], "moves")),)
            if len(entry) == 4 else ()))
    return tuple(entries)


def _str(v, what: str) -> str:
    if not isinstance(v, str):
        raise WireError(f"{what} must be a string, got {type(v).__name__}")
    return v


# -- frames ------------------------------------------------------------------------

def encode(env: Envelope) -> bytes:
    kind = KIND_OF.get(type(env.msg))
    if kind is None:
        raise TypeError(f"no wire form for {type(env.msg).__name__}")
    head = [VERSION, kind, _put_endpoint(env.src), _put_endpoint(env.dst), env.view,
            env.inc, env.dst_inc]
    if kind == "batch":
        return _encode_batch(head, env.msg)
    fields = CODECS[kind][1](env.msg)
    return msgpack.packb([*head, *fields], use_bin_type=True, default=_no_rows)


def _encode_batch(head: list, batch: Batch) -> bytes:
    """The bytes ``packb([*head, *items' fields, bound, cut])`` gives, with the items'
    bytes packed once for both replicas (``_packed_items``): a msgpack list is its
    header (how many follow) and then each element's bytes, in order."""
    count, items = _packed_items(batch.items)
    tail = [list(batch.bound), _put_cut(batch.cut)]
    return b"".join((_list_header(len(head) + count + len(tail)),
                     msgpack.packb(head, use_bin_type=True)[1:], items,  # [1:]: the
                     msgpack.packb(tail, use_bin_type=True)[1:]))        # header (< 16)


def _list_header(n: int) -> bytes:
    """msgpack's header of a list of ``n``."""
    return bytes((0x90 | n,)) if n < 16 else b"\xdc" + n.to_bytes(2, "big")


def decode(frame: bytes) -> Envelope:
    """The envelope in ``frame``, or WireError saying what is wrong with it."""
    if not isinstance(frame, (bytes, bytearray, memoryview)):
        raise WireError(f"a frame must be bytes, got {type(frame).__name__}")
    if len(frame) > MAX_FRAME:
        raise WireError(f"frame of {len(frame)} bytes exceeds the {MAX_FRAME}-byte limit")
    try:
        parts = msgpack.unpackb(frame, raw=False, strict_map_key=True, use_list=True)
    except (msgpack.ExtraData, msgpack.FormatError, msgpack.StackError, ValueError,
            TypeError) as exc:
        raise WireError(f"not a msgpack frame: {type(exc).__name__}: {exc}"[:200]) from None
    if not isinstance(parts, list) or len(parts) < 7:
        raise WireError(f"a frame is a list of at least 7 fields, got {type(parts).__name__}")
    version, kind, src, dst, view, inc, dst_inc, *fields = parts
    if version != VERSION:
        raise WireError(f"wire version {version!r:.20}, this side speaks {VERSION}")
    codec = CODECS.get(kind) if isinstance(kind, str) else None
    if codec is None:
        raise WireError(f"unknown message kind {kind!r:.40}")
    try:
        msg = codec[2](fields)
    except WireError as exc:
        raise WireError(f"{kind}: {exc}") from None
    return Envelope(_endpoint(src, "src"), _endpoint(dst, "dst"), _int(view, "view"),
                    msg, _int(inc, "inc"), _opt_int(dst_inc, "dst_inc"))
