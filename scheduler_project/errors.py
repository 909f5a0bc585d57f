"""The neutral base of every domain error (ledger and payments alike).

A business rule refused an operation and nothing was written. Each subclass
has a stable ``code``, mapped once to the API's error codes
(``payments.api.errors``); ``details`` carries what the client may be told.
Apps subclass it in their own ``exceptions.py``: ``ledger.exceptions.LedgerError``,
``payments.exceptions.PaymentError``.
"""


class DomainError(Exception):
    """A business rule refused the operation; nothing was written."""

    code = "domain_error"

    def __init__(self, message: str = "", **details: object) -> None:
        super().__init__(message or self.__class__.__doc__ or self.code)
        self.message = message or (self.__class__.__doc__ or self.code).strip()
        self.details = details
