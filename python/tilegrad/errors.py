"""Exceptions raised by tilegrad.

Every non-zero ``tg_status`` returned by the library becomes an instance of a
:class:`TilegradError` subclass, one per status code. The exception carries

* ``status``     -- the numeric ``tg_status``,
* ``func``       -- the C entry point that refused the call,
* ``status_str`` -- ``tg_status_str(status)`` (one line of English),
* ``detail``     -- ``tg_ctx_last_error(ctx)``: which argument, which value.

``str(exc)`` contains all of them. Each subclass also derives from the
closest built-in exception (``BadShapeError`` is a ``ValueError``,
``BadIndexError`` an ``IndexError``, ...), so generic handlers work too.

Arguments that Python can reject before calling the library (a wrong dtype,
arrays whose shapes disagree) raise plain ``TypeError`` / ``ValueError``; the
library is not called then, so nothing is written either.
"""

TG_OK = 0
TG_ERR_NULL_ARG = 1
TG_ERR_BAD_SHAPE = 2
TG_ERR_UNSUPPORTED = 3
TG_ERR_BAD_INDEX = 4
TG_ERR_BAD_PARAMS = 5
TG_ERR_OVERFLOW = 6
TG_ERR_NO_MEMORY = 7
TG_ERR_BUSY = 8
TG_ERR_ALIAS = 9


class TilegradError(RuntimeError):
    """A tilegrad entry point returned a non-zero status (base class)."""

    status = None

    def __init__(self, func, status, status_str, detail):
        self.func = func
        self.status = int(status)
        self.status_str = status_str
        self.detail = detail
        msg = f"{func} -> status {status} ({status_str})"
        if detail:
            msg += f": {detail}"
        super().__init__(msg)

    def __reduce__(self):
        return (error_for_status, (self.func, self.status, self.status_str, self.detail))


class NullArgError(TilegradError, ValueError):
    """TG_ERR_NULL_ARG: a required pointer was NULL."""
    status = TG_ERR_NULL_ARG


class BadShapeError(TilegradError, ValueError):
    """TG_ERR_BAD_SHAPE: a size is 0 or sizes disagree."""
    status = TG_ERR_BAD_SHAPE


class UnsupportedError(TilegradError, NotImplementedError):
    """TG_ERR_UNSUPPORTED: valid, but not implemented (e.g. the head dim)."""
    status = TG_ERR_UNSUPPORTED


class BadIndexError(TilegradError, IndexError):
    """TG_ERR_BAD_INDEX: an id / target is out of range."""
    status = TG_ERR_BAD_INDEX


class BadParamsError(TilegradError, ValueError):
    """TG_ERR_BAD_PARAMS: parameter values are inconsistent or invalid."""
    status = TG_ERR_BAD_PARAMS


class SizeOverflowError(TilegradError, OverflowError):
    """TG_ERR_OVERFLOW: an element count / byte size / offset overflows int64."""
    status = TG_ERR_OVERFLOW


class NoMemoryError(TilegradError, MemoryError):
    """TG_ERR_NO_MEMORY: scratch allocation failed (nothing was written)."""
    status = TG_ERR_NO_MEMORY


class BusyError(TilegradError):
    """TG_ERR_BUSY: the context is inside a call on another thread (nothing
    was written; use one context per thread)."""
    status = TG_ERR_BUSY


class AliasError(TilegradError, ValueError):
    """TG_ERR_ALIAS: an output shares memory with an input or another output
    that it may not (nothing was written); only the exact in-place pairs that
    a kernel documents are allowed."""
    status = TG_ERR_ALIAS


ERRORS = {
    TG_ERR_NULL_ARG: NullArgError,
    TG_ERR_BAD_SHAPE: BadShapeError,
    TG_ERR_UNSUPPORTED: UnsupportedError,
    TG_ERR_BAD_INDEX: BadIndexError,
    TG_ERR_BAD_PARAMS: BadParamsError,
    TG_ERR_OVERFLOW: SizeOverflowError,
    TG_ERR_NO_MEMORY: NoMemoryError,
    TG_ERR_BUSY: BusyError,
    TG_ERR_ALIAS: AliasError,
}


def error_for_status(func, status, status_str, detail):
    """The exception instance for a non-zero status (TilegradError for a code
    this version does not know)."""
    cls = ERRORS.get(int(status), TilegradError)
    return cls(func, status, status_str, detail)
