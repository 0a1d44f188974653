"""The `hora-launch` console command: runs the launcher binary installed with this package
(hora/bin/hora-launch, built from launch/ by `pip install ./python`) with the same arguments.
See docs/launch.md for its options."""
import os
import sys


def main():
    exe = os.path.join(os.path.dirname(os.path.abspath(__file__)), "bin", "hora-launch")
    if not os.access(exe, os.X_OK):
        sys.stderr.write(f"hora-launch: {exe} is missing: this hora package was installed without "
                         "its launcher (reinstall with `pip install ./python` from a hora checkout)\n")
        return 1
    os.execv(exe, [exe] + sys.argv[1:])


if __name__ == "__main__":
    sys.exit(main())
