"""Makes Security Event Tokens for the tests with PyJWT and `cryptography`, a JOSE
implementation independent of the one verdict verifies with.

    set_signer.py keys DIR        new RSA-2048 and EC P-256 keys: DIR/rsa-1.pem, DIR/ec-1.pem;
                                  prints their public JWKS (kids rsa-1 and ec-1)
    set_signer.py sign < REQUEST  prints a token; REQUEST is JSON:
                                  {"pem": PATH | null, "alg": "RS256", "kid": "rsa-1" | null,
                                   "typ": "secevent+jwt" | null, "claims": {...},
                                   "hmac_secret_file": PATH (HS256 keyed with a file's bytes)}
"""

import base64
import hashlib
import hmac
import json
import pathlib
import sys

import jwt
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from jwt.algorithms import ECAlgorithm, RSAAlgorithm


def keys(folder):
    folder = pathlib.Path(folder)
    made = {
        "rsa-1": (rsa.generate_private_key(public_exponent=65537, key_size=2048), RSAAlgorithm),
        "ec-1": (ec.generate_private_key(ec.SECP256R1()), ECAlgorithm),
    }
    jwks = []
    for kid, (key, algorithm) in made.items():
        pem = key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
        (folder / f"{kid}.pem").write_bytes(pem)
        public = key.public_key()
        (folder / f"{kid}.pub.pem").write_bytes(
            public.public_bytes(
                serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
            )
        )
        jwk = algorithm.to_jwk(public, as_dict=True)
        jwk.update({"kid": kid, "use": "sig"})
        jwks.append(jwk)
    print(json.dumps({"keys": jwks}))


def b64(data):
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def sign(request):
    headers = {}
    if request.get("kid"):
        headers["kid"] = request["kid"]
    typ = request.get("typ", "secevent+jwt")
    if typ:
        headers["typ"] = typ
    claims = request["claims"]
    if request.get("hmac_secret_file"):
        # The HMAC-with-a-public-key trick, made by hand: PyJWT refuses to do it.
        secret = pathlib.Path(request["hmac_secret_file"]).read_bytes()
        header = {"alg": "HS256", **headers}
        signing_input = f"{b64(json.dumps(header).encode())}.{b64(json.dumps(claims).encode())}"
        mac = hmac.new(secret, signing_input.encode(), hashlib.sha256).digest()
        print(f"{signing_input}.{b64(mac)}")
        return
    key = None
    if request.get("pem"):
        key = pathlib.Path(request["pem"]).read_bytes()
    print(jwt.encode(claims, key, algorithm=request["alg"], headers=headers))


if __name__ == "__main__":
    if sys.argv[1] == "keys":
        keys(sys.argv[2])
    else:
        sign(json.load(sys.stdin))
