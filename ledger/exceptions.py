"""Domain errors of the ledger. Each carries a stable ``code`` the API maps once."""

from scheduler_project.errors import DomainError


class LedgerError(DomainError):
    """Base class: a ledger rule refused the operation; nothing was written."""

    code = "ledger_error"


class InvalidAmount(LedgerError):
    """Amounts are positive integers."""

    code = "invalid_amount"


class SameAccount(LedgerError):
    """Source and destination accounts must differ."""

    code = "same_account"


class AccountNotFound(LedgerError):
    """The account does not exist."""

    code = "account_not_found"


class AmountOverLimit(LedgerError):
    """More than the source account's ``max_payment_amount`` (staff set it per account)."""

    code = "amount_over_limit"


class AccountNotActive(LedgerError):
    """The account is frozen or closed."""

    code = "account_not_active"


class SystemAccountProtected(LedgerError):
    """System accounts (issuance, ...) are always active: staff cannot freeze or close them."""

    code = "system_account_protected"


class InsufficientFunds(LedgerError):
    """The account's available balance does not cover the amount."""

    code = "insufficient_funds"


class HoldNotActive(LedgerError):
    """The hold is missing, already captured or already released."""

    code = "hold_not_active"


class HoldMismatch(LedgerError):
    """The hold does not belong to this transfer's source account or amount."""

    code = "hold_mismatch"


class DuplicateReference(LedgerError):
    """An entry with this reference is already posted."""

    code = "duplicate_reference"


class EntryAlreadyReversed(LedgerError):
    """The entry has already been reversed."""

    code = "entry_already_reversed"


class StaleAccounts(Exception):
    """A batch that read its accounts without locking them found, once it locked
    them, that one changed in a way its checks depended on (status, overdraft
    rule, funds). Nothing is written: the caller rolls back and runs the batch
    again with the accounts locked first. Not a ``LedgerError``: no rule refused
    anything, and no API answer maps it."""
