//! Server secrets: one master key, and the keys derived from it.
//!
//! The master key never touches the database. From it we derive (HKDF-SHA256) the key for keyed
//! digests of identifiers and the AES-256-GCM key that seals tenants' signing secrets at rest.

use std::path::{Path, PathBuf};

use aes_gcm::aead::{Aead, KeyInit, Payload};
use aes_gcm::{Aes256Gcm, Nonce};
use base64::Engine;
use base64::engine::general_purpose::STANDARD as B64;
use hkdf::Hkdf;
use hmac::Mac;
use rand::RngCore;
use secrecy::{ExposeSecret, SecretBox};
use sha2::{Digest, Sha256};

const NONCE_LEN: usize = 12;

/// Errors loading the master key or opening sealed secrets.
#[derive(Debug, thiserror::Error)]
pub enum SecretsError {
    #[error("the master key must be 32 bytes of standard base64")]
    MalformedMasterKey,
    #[error("could not read or create the master key file {path}")]
    KeyFile {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("a sealed secret could not be opened: wrong master key or corrupted row")]
    Unseal,
    #[error(
        "this master key is not the one the database was set up with (its sentinel does not \
         open): every signing secret and connector credential would fail to open. Start with \
         the original key (VERDICT_MASTER_KEY, --master-key-file or the file beside the SQLite \
         database; see the README on backing it up)"
    )]
    WrongMasterKey,
    #[error(
        "the master key file {path} can be read by other users (mode {mode:o}); \
         run `chmod 600 {path}` and start again"
    )]
    KeyFileExposed { path: PathBuf, mode: u32 },
}

/// The 32-byte root secret, from `VERDICT_MASTER_KEY` or a 0600 file beside the SQLite database.
pub struct MasterKey(SecretBox<[u8; 32]>);

impl MasterKey {
    /// Parses the base64 form used in configuration and in the key file.
    pub fn from_base64(text: &str) -> Result<Self, SecretsError> {
        let bytes = B64
            .decode(text.trim())
            .map_err(|_| SecretsError::MalformedMasterKey)?;
        let array: [u8; 32] = bytes
            .try_into()
            .map_err(|_| SecretsError::MalformedMasterKey)?;
        Ok(Self(SecretBox::new(Box::new(array))))
    }

    /// A fresh random key, base64-encoded (what `verdict` writes on first start).
    pub fn generate_base64() -> String {
        let mut bytes = [0u8; 32];
        rand::rng().fill_bytes(&mut bytes);
        B64.encode(bytes)
    }

    /// Reads the key file, creating it (mode 0600) with a fresh key if it does not exist.
    pub fn load_or_create(path: &Path) -> Result<Self, SecretsError> {
        let io_err = |source| SecretsError::KeyFile {
            path: path.to_owned(),
            source,
        };
        match std::fs::read_to_string(path) {
            Ok(text) => {
                refuse_shared(path).map_err(io_err)??;
                Self::from_base64(&text)
            }
            Err(err) if err.kind() == std::io::ErrorKind::NotFound => {
                let text = Self::generate_base64();
                write_private(path, &text).map_err(io_err)?;
                Self::from_base64(&text)
            }
            Err(err) => Err(io_err(err)),
        }
    }

    /// Derives the working keys.
    pub fn keyring(&self) -> Keyring {
        let hk = Hkdf::<Sha256>::new(Some(b"verdict"), self.0.expose_secret());
        let mut digest = [0u8; 32];
        let mut sealing = [0u8; 32];
        // Both `expand` calls ask for 32 bytes, far below HKDF's 8160-byte limit.
        hk.expand(b"identifier digests v1", &mut digest)
            .expect("32 bytes is a valid HKDF output length");
        hk.expand(b"secret sealing v1", &mut sealing)
            .expect("32 bytes is a valid HKDF output length");
        Keyring {
            digest: SecretBox::new(Box::new(digest)),
            sealing: SecretBox::new(Box::new(sealing)),
        }
    }
}

/// A key file that group or others may access is refused, the way ssh refuses a private key.
#[cfg(unix)]
fn refuse_shared(path: &Path) -> std::io::Result<Result<(), SecretsError>> {
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(path)?.permissions().mode() & 0o777;
    Ok(if mode & 0o077 == 0 {
        Ok(())
    } else {
        Err(SecretsError::KeyFileExposed {
            path: path.to_owned(),
            mode,
        })
    })
}

#[cfg(not(unix))]
fn refuse_shared(_path: &Path) -> std::io::Result<Result<(), SecretsError>> {
    Ok(Ok(()))
}

#[cfg(unix)]
fn write_private(path: &Path, text: &str) -> std::io::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir)?;
    }
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)?;
    file.write_all(text.as_bytes())?;
    file.sync_all()
}

#[cfg(not(unix))]
fn write_private(path: &Path, text: &str) -> std::io::Result<()> {
    std::fs::write(path, text)
}

/// What a master-key sentinel holds, and its associated data.
const SENTINEL: &[u8] = b"verdict master key sentinel v1";
const SENTINEL_CONTEXT: &[u8] = b"master-key-sentinel";

/// Keys derived from the master key; cheap to clone behind an `Arc`.
pub struct Keyring {
    digest: SecretBox<[u8; 32]>,
    sealing: SecretBox<[u8; 32]>,
}

impl Keyring {
    /// HMAC-SHA256 under the digest key over length-prefixed parts, so that no two different
    /// part lists can collide by concatenation.
    pub fn digest(&self, parts: &[&[u8]]) -> [u8; 32] {
        let mut mac =
            <hmac::Hmac<Sha256> as hmac::KeyInit>::new_from_slice(self.digest.expose_secret())
                .expect("HMAC accepts keys of any length");
        for part in parts {
            mac.update(&(part.len() as u64).to_be_bytes());
            mac.update(part);
        }
        mac.finalize().into_bytes().into()
    }

    /// Encrypts a secret for storage; `context` (tenant and purpose) is bound as associated data
    /// so a sealed value copied to another row does not open.
    pub fn seal(&self, plaintext: &[u8], context: &[u8]) -> Vec<u8> {
        let cipher = self.cipher();
        let mut nonce = [0u8; NONCE_LEN];
        rand::rng().fill_bytes(&mut nonce);
        let sealed = cipher
            .encrypt(
                &Nonce::from(nonce),
                Payload {
                    msg: plaintext,
                    aad: context,
                },
            )
            .expect("AES-GCM encryption of a short secret cannot fail");
        let mut out = Vec::with_capacity(NONCE_LEN + sealed.len());
        out.extend_from_slice(&nonce);
        out.extend_from_slice(&sealed);
        out
    }

    /// Opens what [`Keyring::seal`] produced under the same context.
    pub fn open(&self, sealed: &[u8], context: &[u8]) -> Result<Vec<u8>, SecretsError> {
        if sealed.len() < NONCE_LEN {
            return Err(SecretsError::Unseal);
        }
        let (nonce, ciphertext) = sealed.split_at(NONCE_LEN);
        let nonce: [u8; NONCE_LEN] = nonce.try_into().map_err(|_| SecretsError::Unseal)?;
        self.cipher()
            .decrypt(
                &Nonce::from(nonce),
                Payload {
                    msg: ciphertext,
                    aad: context,
                },
            )
            .map_err(|_| SecretsError::Unseal)
    }

    /// A new sentinel: a value sealed under this key, stored once per database so that a
    /// process started with another key finds out before it serves anything.
    pub fn sentinel(&self) -> Vec<u8> {
        self.seal(SENTINEL, SENTINEL_CONTEXT)
    }

    /// Whether the database's stored sentinel opens under this key.
    pub fn check_sentinel(&self, stored: &[u8]) -> Result<(), SecretsError> {
        match self.open(stored, SENTINEL_CONTEXT) {
            Ok(plain) if plain == SENTINEL => Ok(()),
            _ => Err(SecretsError::WrongMasterKey),
        }
    }

    fn cipher(&self) -> Aes256Gcm {
        Aes256Gcm::new(self.sealing.expose_secret().into())
    }
}

/// SHA-256 of an API key. API keys are 256-bit random tokens, so an unkeyed hash cannot be
/// reversed by enumeration, and checking keeps working if the master key is ever rotated.
pub fn api_key_hash(api_key: &str) -> [u8; 32] {
    Sha256::digest(api_key.as_bytes()).into()
}

/// Lower-case hex, for digests shown to users.
pub fn hex(bytes: &[u8]) -> String {
    crate::domain::hex(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn keyring() -> Keyring {
        MasterKey::from_base64(&MasterKey::generate_base64())
            .unwrap()
            .keyring()
    }

    #[test]
    fn sealed_secret_opens_only_under_its_own_context() {
        let keys = keyring();
        let sealed = keys.seal(b"whsec_abc", b"tenant-1/inbound");
        assert_eq!(
            keys.open(&sealed, b"tenant-1/inbound").unwrap(),
            b"whsec_abc"
        );
        assert!(keys.open(&sealed, b"tenant-2/inbound").is_err());
    }

    #[test]
    fn a_sentinel_opens_only_under_the_key_that_made_it() {
        let first = MasterKey::from_base64(&MasterKey::generate_base64()).unwrap();
        let other = MasterKey::from_base64(&MasterKey::generate_base64()).unwrap();
        let sentinel = first.keyring().sentinel();
        assert!(first.keyring().check_sentinel(&sentinel).is_ok());
        assert!(matches!(
            other.keyring().check_sentinel(&sentinel),
            Err(SecretsError::WrongMasterKey)
        ));
        assert!(first.keyring().check_sentinel(b"short").is_err());
    }

    #[test]
    fn sealed_secret_does_not_open_under_another_master_key() {
        let sealed = keyring().seal(b"secret", b"ctx");
        assert!(keyring().open(&sealed, b"ctx").is_err());
    }

    #[test]
    fn digest_separates_part_boundaries() {
        let keys = keyring();
        assert_ne!(keys.digest(&[b"ab", b"c"]), keys.digest(&[b"a", b"bc"]));
        assert_eq!(keys.digest(&[b"ab", b"c"]), keys.digest(&[b"ab", b"c"]));
    }

    #[test]
    fn master_key_of_wrong_length_is_refused() {
        assert!(MasterKey::from_base64("c2hvcnQ=").is_err());
    }

    #[cfg(unix)]
    #[test]
    fn key_file_is_created_private_and_reused() {
        use std::os::unix::fs::PermissionsExt;
        let dir = std::env::temp_dir().join(format!("verdict-key-{}", uuid::Uuid::new_v4()));
        let path = dir.join("master.key");
        let first = MasterKey::load_or_create(&path).unwrap().keyring();
        let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
        let again = MasterKey::load_or_create(&path).unwrap().keyring();
        assert_eq!(first.digest(&[b"x"]), again.digest(&[b"x"]));
        for shared in [0o644, 0o640, 0o604] {
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(shared)).unwrap();
            let err = MasterKey::load_or_create(&path).err().unwrap().to_string();
            assert!(
                err.contains(&format!("chmod 600 {}", path.display())),
                "{err}"
            );
        }
        std::fs::remove_dir_all(dir).unwrap();
    }
}
