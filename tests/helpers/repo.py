"""Where things are: the checkout's root (what a child process needs on PYTHONPATH to import
this checkout's ``collectives``), the tests' folders, and the job programs run as processes."""
import os

HELPERS = os.path.dirname(os.path.abspath(__file__))
TESTS = os.path.dirname(HELPERS)
ROOT = os.path.dirname(TESTS)
JOBS = os.path.join(TESTS, "processes", "jobs")


def child_env(extra=None, path=()):
    """This environment for a child Python: the checkout (and ``path``) first on PYTHONPATH."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([*map(str, path), ROOT,
                                         *filter(None, [os.environ.get("PYTHONPATH")])])
    env.update(extra or {})
    return env
