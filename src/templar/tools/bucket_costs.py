"""What a window costs in object-store requests and bytes, and what that costs a month.

Object stores bill the bucket's owner per request and per byte stored (S3 also per byte sent out),
so two questions matter to an operator: what does my node *make* (its requests, whoever's bucket
they go to), and what is my bucket *billed* for (my own requests to it, plus everyone else reading
it). Both are counted here per window from the hyperparameters and the subnet's size, by the same
rules the nodes follow (the steady state of an active node; start-up, catch-up and joins aside):

miner, each window
  own bucket     PUT gradient, PUT commitment; DELETE the gradient and commitment `max_allowed_stale + 2`
                 windows old (`miner.upkeep`; a LIST of each at the first step after a start)
  lead's bucket  GET its inputs of the window (the step every node takes; a few more while its gather
                 runs), GET progress (the sync check), GET the peer list of the window (one request: the
                 lead names a list every window, `comms.exchange.get_peers`). With the lead down, one GET
                 more per slot looked at (`runtime.consensus.succession`)
  peers          HEAD + GET of each top-G gradient
  data bucket    one ranged GET per assigned page (each page read once, then cached)
validator, each window
  lead's bucket  GET progress, GET the peer list (the lead reads its own list)
  miners         HEAD + GET of `fast_eval_uids` gradients (the top-G among them), GET every miner's commitment
  data bucket    ranged GETs of `eval_pages` pages for each of the `uids_per_window` evaluated peers, and
                 of `eval_pages` random pages
lead validator, in addition
  own bucket     PUT (create-only) inputs, aggregate, peer list and progress, GET + PUT of the peer index,
                 GET its own inputs (the window's decision) and peer list (instead of the lead's bucket
                 above; the lead checks no sync); every `checkpoint_frequency` windows a checkpoint
                 (multipart PUT of the model, manifest, latest.json), its cleanup (GET latest.json, five
                 LISTs, DELETEs of old files)

No request is a LIST in the steady state: the five LISTs are the lead's cleanup after each checkpoint
(a validator's four after a start, and a former lead's until its history is gone, are start-up's).
`tests/integration/test_bucket_operations.py` counts a localnet window's real requests against this.

Prices are the providers' published list prices (Cloudflare R2 Standard; AWS S3 Standard in
us-east-1, internet egress in the first 10 TB tier), free tiers left out; check the current pages.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

from templar.core.config import HParams
from templar.runtime.consensus.windows import retained_windows

MIB = 1 << 20
MULTIPART_THRESHOLD = 64 * MIB  # templar.storage.s3: files above this upload in parts
PART_SIZE = 16 * MIB
SMALL_RECORD = 400  # bytes: a commitment, progress or peer-list record (JSON)
PROGRESS_RECORD = 1_600  # bytes: the progress record carries a 256-value fingerprint
SECONDS_PER_DAY = 86_400
DAYS_PER_MONTH = 30


@dataclass(frozen=True)
class Requests:
    """Object-store requests and bytes (up: written, down: read), usually per window."""

    put: float = 0.0
    get: float = 0.0
    head: float = 0.0
    list: float = 0.0
    delete: float = 0.0
    bytes_up: float = 0.0
    bytes_down: float = 0.0

    def __add__(self, other: Requests) -> Requests:
        return Requests(**{f.name: getattr(self, f.name) + getattr(other, f.name) for f in fields(self)})

    def scaled(self, k: float) -> Requests:
        return Requests(**{f.name: getattr(self, f.name) * k for f in fields(self)})

    @property
    def writes(self) -> float:
        """Billed as writes: R2's Class A and S3's PUT/COPY/POST/LIST tier (DELETE is free on both)."""
        return self.put + self.list

    @property
    def reads(self) -> float:
        """Billed as reads: R2's Class B and S3's GET/HEAD tier."""
        return self.get + self.head


@dataclass(frozen=True)
class Prices:
    """A provider's list prices in US dollars."""

    name: str
    description: str
    writes_per_million: float
    reads_per_million: float
    storage_gb_month: float
    egress_per_gb: float


R2 = Prices("R2", "Cloudflare R2 Standard", writes_per_million=4.50, reads_per_million=0.36, storage_gb_month=0.015,
            egress_per_gb=0.0)
S3 = Prices("S3", "AWS S3 Standard, us-east-1 (egress: first 10 TB tier)", writes_per_million=5.00, reads_per_million=0.40, storage_gb_month=0.023,
            egress_per_gb=0.09)
PROVIDERS = (R2, S3)


@dataclass(frozen=True)
class Sizes:
    """Byte sizes of what travels, from the model and hparams (`tools.sizing.window_sizing`)."""

    gradient: float       # upper bound of one compressed gradient
    page: float           # one data page
    aggregate: float      # the lead's published update (upper bound): packed signs, or SparseLoCo's bundle
    checkpoint: float     # the model in float32

    @classmethod
    def of(cls, sizing: dict[str, Any]) -> Sizes:
        n = sizing["parameters"]
        return cls(gradient=sizing["gradient_upload_max_mb"] * 1e6, page=sizing["page_bytes"],
                   aggregate=sizing["aggregate_upload_max_mb"] * 1e6,
                   checkpoint=4.0 * n)


def windows_per_day(hp: HParams) -> float:
    return SECONDS_PER_DAY / hp.windows.window_seconds


def inputs_record(hp: HParams) -> int:
    """Bytes of the lead's inputs record of a window (`templar.wire.inputs`): a 32-byte digest and a
    quoted hotkey per aggregated payload, plus the signed document's fields and the header."""
    return 1024 + hp.gauntlet.top_g * (32 + 52)


def _put_requests(nbytes: float) -> int:
    """PUT-class requests of one upload: one, or create + parts + complete for a multipart upload."""
    return 1 if nbytes <= MULTIPART_THRESHOLD else -(-int(nbytes) // PART_SIZE) + 2


def made(hp: HParams, sizes: Sizes, role: str, *, miners: int) -> dict[str, Requests]:
    """The requests a node makes in one window, by whose bucket they go to ("own", "lead", "peers",
    "data"). `role`: miner, validator or lead."""
    g, gauntlet, data = min(hp.gauntlet.top_g, miners), hp.gauntlet, hp.data
    # the lead's progress, its peer list and its inputs of the window (the step every node takes)
    lead = Requests(get=3, bytes_down=PROGRESS_RECORD + SMALL_RECORD + inputs_record(hp))
    if role == "miner":
        return {
            "own": Requests(put=2, delete=2, bytes_up=sizes.gradient + SMALL_RECORD),
            "lead": lead,
            "peers": Requests(head=g, get=g, bytes_down=g * sizes.gradient),
            "data": Requests(get=data.pages_per_window, bytes_down=data.pages_per_window * sizes.page),
        }
    f = min(gauntlet.fast_eval_uids, miners)
    pages = (min(gauntlet.uids_per_window, miners) + 1) * data.eval_pages
    out = {
        "own": Requests(),
        "lead": lead,
        "peers": Requests(head=f, get=f + miners, bytes_down=f * sizes.gradient + miners * SMALL_RECORD),
        "data": Requests(get=pages, bytes_down=pages * sizes.page),
    }
    if role == "lead":  # publishes, and reads its own peer list (no sync check: it is the reference)
        del out["lead"]
        # inputs, aggregate, peer list, progress (each create-only: one conditional PUT), the peer index;
        # its inputs (the window's decision), the peer list and its index read
        out["own"] = Requests(put=5, get=3,
                              bytes_up=inputs_record(hp) + sizes.aggregate + PROGRESS_RECORD + 2 * SMALL_RECORD,
                              bytes_down=inputs_record(hp) + 2 * SMALL_RECORD) + checkpoint(hp, sizes).scaled(
                                  1 / hp.windows.checkpoint_frequency)
    return out


def checkpoint(hp: HParams, sizes: Sizes) -> Requests:
    """One checkpoint and its cleanup (`comms.checkpoint`, `validator.lead`): uploads, then the old
    checkpoint's two files and the history no joiner can replay any more (aggregates, inputs,
    progress records and peer lists older than `runtime.consensus.succession.retained_windows`) are
    deleted."""
    listings = max(1, -(-retained_windows(hp) // 1000))  # 1,000 keys per LIST page, per kind of record
    return Requests(put=_put_requests(sizes.checkpoint) + 2, get=1, list=1 + 4 * listings,
                    delete=2 + 4 * hp.windows.checkpoint_frequency, bytes_up=sizes.checkpoint + 2 * SMALL_RECORD,
                    bytes_down=SMALL_RECORD)


def served(hp: HParams, sizes: Sizes, role: str, *, miners: int, validators: int,
           joins_per_day: float = 0.0) -> Requests:
    """Requests other nodes make to *your* bucket in one window (what it is billed for besides your
    own). `role`: miner (outside the top-G), top-miner (in it), validator, or lead. Joins: nodes
    that download the lead's checkpoint to start (HEAD + one streaming GET each)."""
    gauntlet = hp.gauntlet
    sampled = validators * min(1.0, gauntlet.fast_eval_uids / max(1, miners))  # validators fast-evaluating you
    commits = Requests(get=validators, bytes_down=validators * SMALL_RECORD)
    if role == "miner":
        return commits + Requests(head=sampled, get=sampled, bytes_down=sampled * sizes.gradient)
    if role == "top-miner":  # every miner aggregates you, every validator gathers you
        readers = miners - 1 + validators
        return commits + Requests(head=readers, get=readers, bytes_down=readers * sizes.gradient)
    if role == "corpus":  # the subnet owner's data bucket: every node's page reads (each page once per node)
        data = hp.data
        pages = miners * data.pages_per_window + validators * (min(gauntlet.uids_per_window, miners) + 1) * data.eval_pages
        return Requests(get=pages, bytes_down=pages * sizes.page)
    if role == "lead":
        readers = miners + validators - 1
        per_window = Requests(get=3 * readers, bytes_down=readers * (PROGRESS_RECORD + SMALL_RECORD + inputs_record(hp)))
        joins = Requests(head=1, get=1, bytes_down=sizes.checkpoint).scaled(joins_per_day / windows_per_day(hp))
        return per_window + joins
    return Requests()


CORPUS_TOKENS = 100e9
"""Tokens of the production corpus the bill assumes (the paper's run; 2 bytes a token)."""


def stored_bytes(hp: HParams, sizes: Sizes, role: str) -> float:
    """What the bucket holds in the steady state (the deletions in docs/buckets.md)."""
    if role == "corpus":
        return CORPUS_TOKENS * (2 if hp.model.vocab_size <= 1 << 16 else 4)
    if role in ("miner", "top-miner"):
        return (hp.windows.max_allowed_stale + 2) * sizes.gradient
    if role == "lead":
        return 3 * sizes.checkpoint + 3 * hp.windows.checkpoint_frequency * sizes.aggregate
    return 0.0


def billed(hp: HParams, sizes: Sizes, role: str, *, miners: int, validators: int,
           joins_per_day: float = 0.0) -> Requests:
    """Per window, everything the bucket of a node of `role` is billed for: its owner's requests to
    it and everyone else's (egress: every byte read from it)."""
    own_role = "miner" if role == "top-miner" else role
    own = made(hp, sizes, own_role, miners=miners)["own"] if own_role in ("miner", "lead") else Requests()
    return own + served(hp, sizes, role, miners=miners, validators=validators, joins_per_day=joins_per_day)


def monthly_cost(per_window: Requests, stored: float, prices: Prices, hp: HParams) -> dict[str, float]:
    """Dollars a month (30 days) for a bucket billed `per_window`, holding `stored` bytes."""
    month = per_window.scaled(windows_per_day(hp) * DAYS_PER_MONTH)
    parts = {
        "writes": month.writes / 1e6 * prices.writes_per_million,
        "reads": month.reads / 1e6 * prices.reads_per_million,
        "storage": stored / 1e9 * prices.storage_gb_month,
        "egress": month.bytes_down / 1e9 * prices.egress_per_gb,
    }
    parts["total"] = sum(parts.values())
    return parts


ROLES = {"miner": "miner", "top-miner": "miner in the top-G", "validator": "validator", "lead": "lead validator",
         "corpus": "corpus (subnet owner)"}


def cost_table(hp: HParams, sizing: dict[str, Any], *, miners: int, validators: int, joins_per_day: float) -> dict:
    """Everything `templar hparams` prints about object storage, as one JSON-able dict."""
    sizes = Sizes.of(sizing)
    per_day = windows_per_day(hp)
    out: dict[str, Any] = {"miners": miners, "validators": validators, "joins_per_day": joins_per_day,
                           "windows_per_day": per_day, "made": {}, "billed": {}}
    for role in ("miner", "validator", "lead"):
        by_bucket = made(hp, sizes, role, miners=miners)
        total = sum(by_bucket.values(), Requests())
        out["made"][role] = {"per_window": {k: vars(v) for k, v in by_bucket.items()},
                             "per_day": vars(total.scaled(per_day))}
    for role in ROLES:
        per_window = billed(hp, sizes, role, miners=miners, validators=validators, joins_per_day=joins_per_day)
        stored = stored_bytes(hp, sizes, role)
        out["billed"][role] = {"per_window": vars(per_window), "stored_bytes": stored,
                               "monthly": {p.name: monthly_cost(per_window, stored, p, hp) for p in PROVIDERS}}
    return out


def format_costs(table: dict) -> str:
    """The human form of `cost_table`: requests made per window and per day, then monthly bills."""
    lines = [f"object store, per window ({table['miners']} miners, {table['validators']} validators; "
             f"{table['windows_per_day']:.0f} windows a day):",
             f"  {'node makes':<12} {'bucket':<7} {'PUT':>6} {'GET':>7} {'HEAD':>6} {'LIST':>5} {'DELETE':>6} "
             f"{'MB up':>9} {'MB down':>9}"]
    for role, made_ in table["made"].items():
        for bucket, r in made_["per_window"].items():
            if any(r.values()):
                lines.append(f"  {role:<12} {bucket:<7} {r['put']:>6.2f} {r['get']:>7.2f} {r['head']:>6.2f} "
                             f"{r['list']:>5.2f} {r['delete']:>6.2f} {r['bytes_up'] / 1e6:>9.3f} "
                             f"{r['bytes_down'] / 1e6:>9.3f}")
        d = made_["per_day"]
        lines.append(f"  {role:<12} {'a day':<7} {d['put']:>6.0f} {d['get']:>7.0f} {d['head']:>6.0f} {d['list']:>5.0f} "
                     f"{d['delete']:>6.0f} {d['bytes_up'] / 1e6:>9.0f} {d['bytes_down'] / 1e6:>9.0f}")
    lines.append("  (LIST is 0 in every window but the lead's checkpoint cleanup)")
    lines.append("your bucket's bill a month, list prices without free tiers ("
                 + "; ".join(f"{p.name}: {p.description}" for p in PROVIDERS) + "):")
    for role, info in table["billed"].items():
        cells = "   ".join(f"{name} ${c['total']:>10,.2f} (egress ${c['egress']:,.2f})"
                           for name, c in info["monthly"].items())
        lines.append(f"  {ROLES[role]:<22} {cells}")
    return "\n".join(lines)


def markdown_costs(table: dict) -> str:
    """The tables of docs/buckets.md: requests each node makes, and each bucket's monthly bill."""
    per_day = table["windows_per_day"]
    lines = ["| node | PUT | GET | HEAD | LIST | DELETE | MB up | MB down | a day: PUT / GET+HEAD / LIST |",
             "|---|---|---|---|---|---|---|---|---|"]
    for role, made_ in table["made"].items():
        total = Requests(**{k: sum(r[k] for r in made_["per_window"].values()) for k in vars(Requests())})
        lines.append(f"| {role} | {total.put:g} | {total.get:g} | {total.head:g} | {total.list:.2f} | "
                     f"{total.delete:.2f} | {total.bytes_up / 1e6:,.1f} | {total.bytes_down / 1e6:,.1f} | "
                     f"{total.put * per_day:,.0f} / {total.reads * per_day:,.0f} / {total.list * per_day:,.0f} |")
    lines += ["", "| bucket of | billed requests a window (writes / reads) | stored | "
              + " | ".join(f"{p.name} a month (egress)" for p in PROVIDERS) + " |",
              "|---|---|---|" + "---|" * len(PROVIDERS)]
    for role, info in table["billed"].items():
        r = Requests(**info["per_window"])
        cells = " | ".join(f"${c['total']:,.2f} (${c['egress']:,.2f})" for c in info["monthly"].values())
        lines.append(f"| {ROLES[role]} | {r.writes:.2f} / {r.reads:.2f} | {info['stored_bytes'] / 1e9:,.2f} GB | "
                     f"{cells} |")
    return "\n".join(lines)
