"""The one error type users see: a one-line message, exit code 2, no traceback."""


class CamrenderError(Exception):
    """A problem with the user's input or environment.

    The CLI prints ``str(error)`` as a single line on stderr and exits with ``exit_code``.
    Messages name the file, frame and field where that applies, e.g.
    ``orbit.json: frame 12: c2w: rotation is not orthonormal``.
    """

    exit_code = 2

    def __init__(self, message: str, *, path=None, frame=None, field=None):
        parts = [str(p) for p in (path, None if frame is None else f"frame {frame}", field) if p is not None]
        self.path, self.frame, self.field = path, frame, field
        self.detail = message
        super().__init__(": ".join(parts + [message]))
