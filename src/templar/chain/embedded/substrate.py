"""`EmbeddedSubstrate`: the bittensor SDK's `Substrate` protocol over the SQLite chain store.

`bt.Subtensor(network, substrate=EmbeddedSubstrate(path))` drives the *real* SDK (intents,
preflights, weight normalisation, the MEV-shield registration path, metagraph and commitment
decoding) against a chain that lives in one file, so the same adapter code runs in tests,
on a laptop localnet and on finney. Reads return the decoded value shapes the RPC backend
produces; writes run `runtime.apply` inside one SQLite transaction per extrinsic.

Limits, by design: chain state is not versioned (a read pinned to a past block sees the
current state, though `Timestamp.Now` and block hashes are exact for every block); the
embedded block author cannot decrypt ML-KEM, so a MEV-shielded call executes only when the
inner extrinsic was signed by the same `EmbeddedSubstrate` instance that submits the carrier
(which is always the case for `execute`); every process sharing the file is trusted (no
fees, no transaction pool, no nonce ordering). Storage items, runtime APIs and calls it does
not model raise or fail with a message naming them rather than answering silently.
"""

from __future__ import annotations

import asyncio
import hashlib
import inspect
import json
import sqlite3
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from bittensor.balance import Balance
from bittensor.result import ChainError as SdkChainError
from bittensor.result import ExtrinsicResult, chain_error_from_substrate_request
from bittensor.sp_core import verify as sr25519_verify

from templar.chain.embedded import epochs, runtime, store
from templar.chain.embedded.chainstate import EPOCH_ITEMS, metagraph, storage_map, storage_value, unsupported
from templar.chain.embedded.store import ChainSpec, ChainStore, Now

SPEC_VERSION = 1
EXISTENTIAL_DEPOSIT = 500


def create_chain(path: str | Path, spec: ChainSpec | None = None, *, now: Now = time.time) -> ChainStore:
    """Create the chain file with genesis `spec` (or open it unchanged when it already exists)."""
    return ChainStore.create(path, spec or ChainSpec(), now=now)


POOL_MESSAGES = {
    "PriorityTooLow": "1014: Priority is too low: (1 vs 1)",
    "Stale": "1010: Invalid Transaction: Transaction is outdated",
    "Future": "1010: Invalid Transaction: Transaction will be valid in the future",
    "RateLimitExceeded": "1010: Invalid Transaction: Custom error: 6",
    "StakeAmountTooLow": "1010: Invalid Transaction: Custom error: 1",
}
"""What a subtensor node's RPC answers when its transaction pool refuses an extrinsic, by the name
the SDK resolves it to (`bittensor.result.chain_error_from_substrate_request`)."""


class PoolRefusal(Exception):
    """The RPC error a node raises for a pool rejection (what the SDK's transport would catch)."""


def _pool_rejection(fault: store.Fault) -> ExtrinsicResult:
    """A pool rejection as the SDK's RPC backend reports one: nothing landed, no nonce used, and
    the SDK's own parser names the error from the node's text."""
    error = chain_error_from_substrate_request(
        PoolRefusal(fault.message or POOL_MESSAGES.get(fault.error_name, fault.error_name)))
    return ExtrinsicResult(success=False, message=error.message, error=error)


class ComposedCall:
    """A call as `compose` returns it: the attributes the SDK reads off a composed call."""

    def __init__(self, module: str, function: str, params: dict) -> None:
        self.module, self.function, self.params = module, function, params

    @property
    def data(self) -> bytes:
        # Stand-in for SCALE bytes: deterministic in the call, never decoded by anyone.
        return repr((self.module, self.function, sorted(self.params.items()))).encode()

    @property
    def call_hash(self) -> bytes:
        return hashlib.blake2b(self.data, digest_size=32).digest()

    def __iter__(self):
        return iter((self.module, self.function, self.params))

    def __repr__(self) -> str:
        return f"ComposedCall({self.module}.{self.function})"


class EmbeddedSubstrate:
    """A `bittensor.Substrate` over one embedded chain file. Use one instance per process."""

    def __init__(self, path: str | Path, *, now: Now = time.time) -> None:
        self.store = ChainStore(path, now=now)
        self.clock = self.store.clock
        self.token_symbols: dict[int, str] = {}
        # A syntactically valid ML-KEM-768 encapsulation key (t = 0 || rho); see module docstring.
        self._next_key = (
            bytes(1152) + hashlib.blake2b(self.store.genesis_hash.encode(), digest_size=32).digest()
        )
        # (signer, nonce) -> (inner call, inner hash) signed for a MEV-shield carrier.
        self._shielded: dict[tuple[str, int], tuple[ComposedCall, str]] = {}

    # -- display metadata / lifecycle --------------------------------------------------------

    def balance(self, rao: int, netuid: int = 0) -> Balance:
        return Balance(int(rao), netuid, self.token_symbols.get(netuid) if netuid else None)

    async def connect(self) -> None:
        """Nothing to open: the store was opened (and validated) at construction."""

    async def close(self) -> None:
        self.store.close()

    # -- blocks ------------------------------------------------------------------------------

    def _hash(self, block: int) -> str:
        return f"0x{block:064x}"

    def _block_of(self, block_hash: str | None) -> int:
        if block_hash is None:
            return self.clock.block()
        try:
            return int(block_hash, 16)
        except (TypeError, ValueError):
            raise SdkChainError(f"unknown block hash {block_hash!r}") from None

    async def block_hash(self, block: int | None = None) -> str | None:
        head = self.clock.block()
        number = head if block is None else int(block)
        if number > head or number < self.clock.genesis_block:
            return None  # not produced (yet): what a node answers for chain_getBlockHash
        return self._hash(number)

    async def block_number(self) -> int:
        return self.clock.block()

    async def finalized_block_number(self) -> int:
        return self.clock.block()  # instant finality

    async def block_time(self) -> float:
        return self.clock.block_time

    async def spec_version(self) -> int:
        return SPEC_VERSION

    def _timestamp_ms(self, block: int) -> int:
        return round(self.clock.timestamp(block) * 1000)

    async def get_block(self, block_number: int | None = None, block_hash: str | None = None) -> dict | None:
        number = self._block_of(block_hash) if block_number is None else int(block_number)
        if await self.block_hash(number) is None:
            return None
        inherent = {
            "call": {
                "call_module": "Timestamp",
                "call_function": "set",
                "call_args": [{"name": "now", "value": self._timestamp_ms(number)}],
            }
        }
        header = {"number": number, "hash": self._hash(number), "parentHash": self._hash(number - 1)}
        return {"header": header, "extrinsics": [inherent]}

    async def blocks(self, *, finalized: bool = False) -> AsyncIterator[dict]:
        last = None
        while True:
            number = self.clock.block()
            if last is None or number > last:
                last = number
                yield {
                    "header": {
                        "number": number,
                        "hash": self._hash(number),
                        "parentHash": self._hash(number - 1),
                    }
                }
            wait = self.clock.timestamp(number + 1) - self.clock.now()
            await asyncio.sleep(min(max(wait, 0.01), self.clock.block_time))

    async def events(self, block_hash: str | None = None) -> list[dict]:
        block = self._block_of(block_hash)
        with self.store.read() as conn:
            return store.block_events(conn, block)

    # -- subnet epochs -----------------------------------------------------------------------

    def _advance_epochs(self) -> None:
        """Run the Yuma epochs that fell due (see `templar.chain.embedded.epochs`) before a read of their results.

        A cheap read decides first, so the write lock is taken only when an epoch is due.
        """
        block = self.clock.block()
        with self.store.read() as conn:
            due = epochs.pending(conn, block)
        if due:
            with self.store.write() as conn:
                epochs.advance(conn, block)

    # -- storage reads -----------------------------------------------------------------------

    async def query(
        self, module: str, storage_function: str, params: list | None = None, block_hash: str | None = None
    ) -> Any:
        block = self._block_of(block_hash)
        if storage_function in EPOCH_ITEMS:
            self._advance_epochs()
        with self.store.read() as conn:
            return storage_value(
                conn, module, storage_function, list(params or []), self._timestamp_ms(block)
            )

    async def query_batch(
        self, module: str, storage_function: str, param_sets: list[list], block_hash: str | None = None
    ) -> list[Any]:
        block = self._block_of(block_hash)
        with self.store.read() as conn:
            stamp = self._timestamp_ms(block)
            return [storage_value(conn, module, storage_function, list(p), stamp) for p in param_sets]

    async def query_map(
        self, module: str, storage_function: str, params: list | None = None, block_hash: str | None = None
    ) -> list[tuple[Any, Any]]:
        with self.store.read() as conn:
            return storage_map(conn, module, storage_function, list(params or []))

    async def map_has_entries(
        self, module: str, storage_function: str, params: list, block_hash: str | None = None
    ) -> bool:
        return bool(await self.query_map(module, storage_function, params, block_hash))

    # -- runtime APIs and constants ----------------------------------------------------------

    async def runtime_call(self, api: str, method: str, params: list, block_hash: str | None = None) -> Any:
        block = self._block_of(block_hash)
        if (api, method) == ("SubnetInfoRuntimeApi", "get_metagraph"):
            self._advance_epochs()
            with self.store.read() as conn:
                return metagraph(conn, int(params[0]), block)
        if (api, method) == ("SwapRuntimeApi", "current_alpha_price"):
            return store.RAO_PER_TAO  # alpha is pegged 1:1 to TAO
        if (api, method) in (
            ("SwapRuntimeApi", "sim_swap_tao_for_alpha"),
            ("SwapRuntimeApi", "sim_swap_alpha_for_tao"),
        ):
            amount = int(params.get("tao", params.get("alpha", 0)))
            return {"alpha_amount": amount, "tao_amount": amount, "tao_fee": 0, "alpha_fee": 0}
        if (api, method) == ("SubnetRegistrationRuntimeApi", "get_network_registration_cost"):
            return self.store.spec.subnet_lock_rao
        raise unsupported(f"runtime API {api}.{method}")

    async def constant(self, module: str, name: str) -> Any:
        value = {
            ("Aura", "SlotDuration"): round(self.clock.block_time * 1000),
            ("Balances", "ExistentialDeposit"): EXISTENTIAL_DEPOSIT,
            ("Commitments", "MaxFields"): runtime.MAX_COMMITMENT_FIELDS,
            ("SubtensorModule", "InitialStartCallDelay"): 0,
        }.get((module, name))
        if value is None:
            raise unsupported(f"constant {module}.{name}")
        return value

    async def decode_scale(self, type_string: str, data: Any) -> Any:
        raise unsupported("SCALE decoding (there is no runtime metadata)")

    # -- calls and fees ----------------------------------------------------------------------

    async def compose(self, call) -> ComposedCall:
        if isinstance(call, ComposedCall):
            return call
        module, function, params = call
        return ComposedCall(module, function, dict(params))

    async def estimate_fee(self, call, keypair) -> Balance:
        return Balance.from_rao(0)  # the embedded chain charges no fees

    async def estimate_weight(self, call, keypair) -> dict:
        return {"ref_time": 0, "proof_size": 0}

    async def account_next_index(self, address: str) -> int:
        with self.store.read() as conn:
            return store.account(conn, address)[1]

    async def mev_next_key(self) -> bytes | None:
        return self._next_key

    # -- writes ------------------------------------------------------------------------------

    async def _signed(self, call: ComposedCall, keypair, nonce: int) -> tuple[bytes, str]:
        """A stand-in signed extrinsic: the call bytes plus the signer's real signature."""
        payload = call.data + b"|" + keypair.ss58_address.encode() + b"|" + str(nonce).encode()
        signature = keypair.sign(payload)
        if inspect.isawaitable(signature):
            signature = await signature
        if not sr25519_verify(payload, bytes(signature), keypair.ss58_address, keypair.crypto_type):
            raise SdkChainError(f"the signature by {keypair.ss58_address} does not verify", "BadSignature")
        blob = payload + b"|" + bytes(signature)
        return blob, "0x" + hashlib.blake2b(blob, digest_size=32).hexdigest()

    async def sign_extrinsic(self, call, keypair, *, nonce: int, period: int) -> tuple[bytes, str]:
        composed = await self.compose(call)
        blob, extrinsic_hash = await self._signed(composed, keypair, nonce)
        self._shielded[(keypair.ss58_address, nonce)] = (composed, extrinsic_hash)
        return blob, extrinsic_hash

    async def submit(
        self,
        call,
        keypair,
        *,
        nonce: int | None = None,
        period: int | None = None,
        wait_for_inclusion: bool = True,
        wait_for_finalization: bool = True,
    ) -> ExtrinsicResult:
        composed = await self.compose(call)
        signer = keypair.ss58_address
        if nonce is None:
            nonce = await self.account_next_index(signer)
        _, extrinsic_hash = await self._signed(composed, keypair, nonce)
        with self.store.write() as conn:
            block = self.clock.block()
            epochs.advance(conn, block)  # an epoch due now reads the weights from before this call
            if (composed.module, composed.function) != ("MevShield", "submit_encrypted"):
                fault = store.take_fault(conn, composed.module, composed.function, signer)
                if fault is not None and fault.stage == "pool":
                    return _pool_rejection(fault)
                failure = runtime.DispatchError(fault.error_name, fault.message or f"{fault.error_name} "
                                                "(injected)") if fault else None
                return self._execute(conn, block, signer, nonce, composed, extrinsic_hash, failure)
            inner = self._shielded.pop((signer, nonce + 1), None)
            if inner is None:
                failure = runtime.DispatchError(
                    None,
                    "the embedded block author cannot decrypt this MEV-shield carrier: its inner "
                    "extrinsic was not signed by this EmbeddedSubstrate instance",
                )
                return self._execute(conn, block, signer, nonce, composed, extrinsic_hash, failure)
            carrier = self._execute(conn, block, signer, nonce, composed, extrinsic_hash)
            self._execute(conn, block, signer, nonce + 1, inner[0], inner[1])
            return carrier

    def _execute(
        self,
        conn: sqlite3.Connection,
        block: int,
        signer: str,
        nonce: int,
        call: ComposedCall,
        extrinsic_hash: str,
        failure: runtime.DispatchError | None = None,
    ) -> ExtrinsicResult:
        """Apply one extrinsic inside the open write transaction and record its receipt."""
        idx = conn.execute("SELECT COUNT(*) FROM extrinsics WHERE block = ?", (block,)).fetchone()[0] + 1
        events: list[dict] = []
        if failure is None and (call.module, call.function) == ("MevShield", "submit_encrypted"):
            events = [runtime.event("MevShield", "EncryptedSubmitted", [signer])]
        elif failure is None:
            conn.execute("SAVEPOINT call")
            try:
                ctx = runtime.Context(conn=conn, spec=self.store.spec, block=block, signer=signer)
                events = runtime.apply(ctx, call.module, call.function, call.params)
            except runtime.DispatchError as error:
                conn.execute("ROLLBACK TO call")
                failure = error
            conn.execute("RELEASE call")
        events.append(runtime.event("System", "ExtrinsicFailed" if failure else "ExtrinsicSuccess", {}))
        for record in events:
            record["extrinsic_idx"] = idx
        conn.execute(
            "INSERT INTO accounts (address, nonce) VALUES (?, ?) "
            "ON CONFLICT (address) DO UPDATE SET nonce = MAX(nonce, excluded.nonce)",
            (signer, nonce + 1),
        )
        conn.execute(
            "INSERT OR REPLACE INTO extrinsics (hash, block, idx, signer, module, function, success, "
            "error_name, error_message, events) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (
                extrinsic_hash,
                block,
                idx,
                signer,
                call.module,
                call.function,
                int(failure is None),
                failure.name if failure else None,
                failure.message if failure else None,
                json.dumps(events),
            ),
        )
        return self._receipt(
            block,
            idx,
            failure is None,
            failure.name if failure else None,
            failure.message if failure else None,
            events,
        )

    def _receipt(
        self,
        block: int,
        idx: int,
        success: bool,
        error_name: str | None,
        error_message: str | None,
        events: list[dict],
    ) -> ExtrinsicResult:
        error = None if success else SdkChainError(error_message or "extrinsic failed", error_name)
        return ExtrinsicResult(
            success=success,
            message="Success" if success else (error_message or "extrinsic failed"),
            block_hash=self._hash(block),
            extrinsic_id=f"{block}-{idx:04d}",
            fee=Balance.from_rao(0),
            events=events,
            error=error,
        )

    async def find_extrinsic(self, extrinsic_hash: str, block_hash: str) -> ExtrinsicResult | None:
        with self.store.read() as conn:
            row = store.extrinsic_row(conn, extrinsic_hash)
        if row is None or row[0] != self._block_of(block_hash):
            return None
        block, idx, success, error_name, error_message, events = row
        return self._receipt(block, idx, bool(success), error_name, error_message, json.loads(events))

    # -- out of scope for a dev chain --------------------------------------------------------

    async def prepare(self, call, *, address: str, **kwargs: Any):
        raise unsupported("out-of-process signing (prepare/submit_signature)")

    async def submit_signature(self, unsigned, signature, **kwargs: Any) -> ExtrinsicResult:
        raise unsupported("out-of-process signing (prepare/submit_signature)")

    async def submit_signed(self, extrinsic, keypair, **kwargs: Any) -> ExtrinsicResult:
        raise unsupported("pre-signed extrinsics")

    def multisig_account(self, signatories: list[str], threshold: int):
        raise unsupported("multisig accounts")

    async def submit_multisig(self, call, keypair, multisig_account, **kwargs: Any) -> ExtrinsicResult:
        raise unsupported("multisig accounts")
