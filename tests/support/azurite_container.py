"""Create a blob container on Azurite (the Azure Storage emulator) for the object-store
tests: one SharedKey-signed `PUT ?restype=container` with the emulator's well-known
development account (public in Microsoft's documentation, not a secret).

Usage: python3 azurite_container.py http://127.0.0.1:PORT CONTAINER
"""
import base64
import hashlib
import hmac
import sys
import urllib.request
from email.utils import formatdate

ACCOUNT = "devstoreaccount1"
KEY = "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="


def main(endpoint: str, container: str) -> int:
    date, version, ctype = formatdate(usegmt=True), "2021-08-06", "application/octet-stream"
    # SharedKey string to sign: verb, 11 standard headers (Content-Type the 5th of them),
    # the x-ms- headers, the resource (the emulator's path repeats the account).
    to_sign = "\n".join(
        ["PUT", "", "", "", "", ctype, "", "", "", "", "", ""]
        + [f"x-ms-date:{date}\nx-ms-version:{version}", f"/{ACCOUNT}/{ACCOUNT}/{container}\nrestype:container"]
    )
    sig = base64.b64encode(hmac.new(base64.b64decode(KEY), to_sign.encode(), hashlib.sha256).digest()).decode()
    req = urllib.request.Request(
        f"{endpoint}/{ACCOUNT}/{container}?restype=container",
        method="PUT",
        data=b"",
        headers={
            "Content-Type": ctype,
            "x-ms-date": date,
            "x-ms-version": version,
            "Authorization": f"SharedKey {ACCOUNT}:{sig}",
        },
    )
    return 0 if urllib.request.urlopen(req, timeout=30).status == 201 else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2]))
