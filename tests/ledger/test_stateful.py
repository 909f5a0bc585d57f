"""Hypothesis drives the ledger services against a pure-Python model.

After every step: balances, held amounts and hold states equal the model's,
the deferred zero-sum trigger is forced to check now (``SET CONSTRAINTS ALL
IMMEDIATE``), and a full reconciliation is clean.
"""

import pytest
from django.db import connection, transaction
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    Bundle,
    RuleBasedStateMachine,
    consumes,
    invariant,
    rule,
    run_state_machine_as_test,
)

from ledger import services as ledger
from ledger.exceptions import (
    AccountNotActive,
    HoldNotActive,
    InsufficientFunds,
    SameAccount,
)
from ledger.models import Account, Hold
from ledger.reconciliation import reconcile
from tests.factories import UserFactory

N_ACCOUNTS = 4
amounts = st.integers(min_value=1, max_value=1_500)
account_index = st.integers(min_value=0, max_value=N_ACCOUNTS - 1)


class LedgerMachine(RuleBasedStateMachine):
    holds = Bundle("holds")

    def __init__(self):
        super().__init__()
        self._atomic = transaction.atomic()
        self._atomic.__enter__()
        owner = UserFactory()
        self.ids = [ledger.account_create(owner=owner, name=f"m{i}").pk for i in range(N_ACCOUNTS)]
        self.issuance = ledger.issuance_account().pk
        issued = Account.objects.get(pk=self.issuance).balance
        self.balance = dict.fromkeys(self.ids, 0) | {self.issuance: issued}
        self.held = dict.fromkeys(self.ids, 0)
        self.frozen: set[int] = set()
        self.hold_state: dict[int, tuple[int, int, str]] = {}

    def teardown(self):
        transaction.set_rollback(True)
        self._atomic.__exit__(None, None, None)

    def available(self, account_id):
        return self.balance[account_id] - self.held[account_id]

    @rule(i=account_index, amount=amounts)
    def deposit(self, i, amount):
        account_id = self.ids[i]
        if account_id in self.frozen:
            with pytest.raises(AccountNotActive):
                ledger.deposit(account_id=account_id, amount=amount)
            return
        ledger.deposit(account_id=account_id, amount=amount)
        self.balance[account_id] += amount
        self.balance[self.issuance] -= amount

    @rule(i=account_index, j=account_index, amount=amounts)
    def transfer(self, i, j, amount):
        source, target = self.ids[i], self.ids[j]
        call = lambda: ledger.transfer_post(  # noqa: E731
            from_account_id=source, to_account_id=target, amount=amount
        )
        if source == target:
            with pytest.raises(SameAccount):
                call()
        elif source in self.frozen or target in self.frozen:
            with pytest.raises(AccountNotActive):
                call()
        elif self.available(source) < amount:
            with pytest.raises(InsufficientFunds):
                call()
        else:
            call()
            self.balance[source] -= amount
            self.balance[target] += amount

    @rule(target=holds, i=account_index, amount=amounts)
    def place_hold(self, i, amount):
        account_id = self.ids[i]
        if account_id in self.frozen:
            with pytest.raises(AccountNotActive):
                ledger.hold_place(account_id=account_id, amount=amount)
            return None
        if self.available(account_id) < amount:
            with pytest.raises(InsufficientFunds):
                ledger.hold_place(account_id=account_id, amount=amount)
            return None
        hold = ledger.hold_place(account_id=account_id, amount=amount)
        self.held[account_id] += amount
        self.hold_state[hold.pk] = (account_id, amount, "active")
        return hold.pk

    @rule(hold_id=consumes(holds))
    def release(self, hold_id):
        if hold_id is None:
            return
        account_id, amount, state = self.hold_state[hold_id]
        if state != "active":
            with pytest.raises(HoldNotActive):
                ledger.hold_release(hold_id=hold_id)
            return
        ledger.hold_release(hold_id=hold_id)
        self.held[account_id] -= amount
        self.hold_state[hold_id] = (account_id, amount, "released")

    @rule(hold_id=holds, j=account_index)
    def capture(self, hold_id, j):
        if hold_id is None:
            return
        account_id, amount, state = self.hold_state[hold_id]
        target = self.ids[j]
        call = lambda: ledger.hold_capture(hold_id=hold_id, to_account_id=target)  # noqa: E731
        if target == account_id:
            with pytest.raises(SameAccount):
                call()
        elif state != "active":
            with pytest.raises(HoldNotActive):
                call()
        elif account_id in self.frozen or target in self.frozen:
            with pytest.raises(AccountNotActive):
                call()
        else:
            call()
            self.held[account_id] -= amount
            self.balance[account_id] -= amount
            self.balance[target] += amount
            self.hold_state[hold_id] = (account_id, amount, "captured")

    @rule(i=account_index)
    def toggle_frozen(self, i):
        account_id = self.ids[i]
        status = "active" if account_id in self.frozen else "frozen"
        ledger.account_set_status(account_id=account_id, status=status)
        self.frozen.symmetric_difference_update({account_id})

    @invariant()
    def database_matches_model(self):
        rows = Account.objects.filter(pk__in=self.balance).values_list("pk", "balance", "held")
        for pk, balance, held in rows:
            assert balance == self.balance[pk]
            assert held == self.held.get(pk, 0)
        states = dict(Hold.objects.filter(pk__in=self.hold_state).values_list("pk", "status"))
        assert states == {pk: s for pk, (_, _, s) in self.hold_state.items()}

    @invariant()
    def invariants_hold(self):
        with connection.cursor() as cursor:
            cursor.execute("SET CONSTRAINTS ALL IMMEDIATE")
            cursor.execute("SET CONSTRAINTS ALL DEFERRED")
        report = reconcile()
        assert report.ok, report.as_dict()


@pytest.mark.django_db
def test_ledger_state_machine():
    run_state_machine_as_test(
        LedgerMachine,
        settings=settings(
            max_examples=int(__import__("os").environ.get("HX", 40)),
            stateful_step_count=25,
            deadline=None,
            suppress_health_check=[HealthCheck.too_slow],
        ),
    )
