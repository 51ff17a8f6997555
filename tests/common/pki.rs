//! Throwaway certificate authorities for TLS tests (rcgen, in a temp dir).

use std::path::{Path, PathBuf};

use rcgen::{
    BasicConstraints, CertificateParams, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose,
};

pub struct Ca {
    pub dir: PathBuf,
    pub name: String,
    pub ca_file: PathBuf,
    issuer: Issuer<'static, KeyPair>,
}

/// A certificate and its key, as files.
#[derive(Clone, Debug)]
pub struct Leaf {
    pub cert_file: PathBuf,
    pub key_file: PathBuf,
}

impl Ca {
    /// A new CA named `name`, its certificate written to `dir/name-ca.pem`.
    pub fn new(dir: &Path, name: &str) -> Ca {
        std::fs::create_dir_all(dir).unwrap();
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, format!("{name} test CA"));
        params.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        let key = KeyPair::generate().unwrap();
        let cert = params.self_signed(&key).unwrap();
        let ca_file = dir.join(format!("{name}-ca.pem"));
        std::fs::write(&ca_file, cert.pem()).unwrap();
        Ca {
            dir: dir.to_path_buf(),
            name: name.to_string(),
            ca_file,
            issuer: Issuer::new(params, key),
        }
    }

    /// A leaf for both TLS roles with the given DNS/IP names, written to
    /// `dir/<file>.pem` and `dir/<file>-key.pem`.
    pub fn leaf(&self, file: &str, names: &[&str]) -> Leaf {
        let mut params =
            CertificateParams::new(names.iter().map(|s| s.to_string()).collect::<Vec<_>>())
                .unwrap();
        params.use_authority_key_identifier_extension = true;
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        params.extended_key_usages = vec![
            ExtendedKeyUsagePurpose::ServerAuth,
            ExtendedKeyUsagePurpose::ClientAuth,
        ];
        let key = KeyPair::generate().unwrap();
        let cert = params.signed_by(&key, &self.issuer).unwrap();
        let leaf = Leaf {
            cert_file: self.dir.join(format!("{file}.pem")),
            key_file: self.dir.join(format!("{file}-key.pem")),
        };
        std::fs::write(&leaf.key_file, key.serialize_pem()).unwrap();
        std::fs::write(&leaf.cert_file, cert.pem()).unwrap();
        leaf
    }
}

/// A fresh directory under the system temp dir for one test.
pub fn temp_dir(test: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("sluice-{test}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}
