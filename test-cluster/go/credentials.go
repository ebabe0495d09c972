package main

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/base64"
	"encoding/hex"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"strings"
	"time"
)

// credentials are the files the API server is started with and the admin
// token a client presents.
type credentials struct {
	// caFile is the certificate authority that signed the serving
	// certificate; clients verify the server against it.
	caFile  string
	caPEM   []byte
	tlsCert string
	tlsKey  string
	// saKey signs and verifies service account tokens (the API server
	// insists on one, though the tests use none).
	saKey string
	// tokenFile holds the one static token, for user "admin" in group
	// system:masters (everything allowed under RBAC).
	tokenFile string
	token     string
}

// writeCredentials generates a CA, a serving certificate for 127.0.0.1 and
// localhost signed by it, a service account key and an admin token, and
// writes them into dir. A kept data directory reuses them instead
// (loadCredentials).
func writeCredentials(dir string) (*credentials, error) {
	now := time.Now()
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	caTemplate := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: "test-cluster-ca"},
		NotBefore:             now.Add(-time.Hour),
		NotAfter:              now.Add(7 * 24 * time.Hour),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTemplate, caTemplate, &caKey.PublicKey, caKey)
	if err != nil {
		return nil, fmt.Errorf("CA certificate: %w", err)
	}
	caCert, err := x509.ParseCertificate(caDER)
	if err != nil {
		return nil, err
	}

	servingKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	servingTemplate := &x509.Certificate{
		SerialNumber: big.NewInt(2),
		Subject:      pkix.Name{CommonName: "kube-apiserver"},
		NotBefore:    now.Add(-time.Hour),
		NotAfter:     now.Add(7 * 24 * time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		IPAddresses:  []net.IP{net.IPv4(127, 0, 0, 1)},
		DNSNames:     []string{"localhost", "kubernetes.default.svc"},
	}
	servingDER, err := x509.CreateCertificate(rand.Reader, servingTemplate, caCert, &servingKey.PublicKey, caKey)
	if err != nil {
		return nil, fmt.Errorf("serving certificate: %w", err)
	}

	saKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}

	tokenBytes := make([]byte, 32)
	if _, err := rand.Read(tokenBytes); err != nil {
		return nil, err
	}

	c := &credentials{
		caFile:    filepath.Join(dir, "ca.crt"),
		caPEM:     pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: caDER}),
		tlsCert:   filepath.Join(dir, "apiserver.crt"),
		tlsKey:    filepath.Join(dir, "apiserver.key"),
		saKey:     filepath.Join(dir, "service-account.key"),
		tokenFile: filepath.Join(dir, "tokens.csv"),
		token:     hex.EncodeToString(tokenBytes),
	}
	servingKeyPEM, err := ecKeyPEM(servingKey)
	if err != nil {
		return nil, err
	}
	saKeyPEM, err := ecKeyPEM(saKey)
	if err != nil {
		return nil, err
	}
	files := []struct {
		path string
		data []byte
	}{
		{c.caFile, c.caPEM},
		{c.tlsCert, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: servingDER})},
		{c.tlsKey, servingKeyPEM},
		{c.saKey, saKeyPEM},
		{c.tokenFile, []byte(c.token + ",admin,admin,\"system:masters\"\n")},
	}
	for _, f := range files {
		if err := os.WriteFile(f.path, f.data, 0o600); err != nil {
			return nil, err
		}
	}
	return c, nil
}

// loadCredentials reads the credentials an earlier run wrote into dir (a
// kept data directory), or returns nil if there are none.
func loadCredentials(dir string) (*credentials, error) {
	tokenFile := filepath.Join(dir, "tokens.csv")
	tokens, err := os.ReadFile(tokenFile)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	token, _, ok := strings.Cut(string(tokens), ",")
	if !ok || token == "" {
		return nil, fmt.Errorf("%s: no token", tokenFile)
	}
	caFile := filepath.Join(dir, "ca.crt")
	caPEM, err := os.ReadFile(caFile)
	if err != nil {
		return nil, err
	}
	return &credentials{
		caFile:    caFile,
		caPEM:     caPEM,
		tlsCert:   filepath.Join(dir, "apiserver.crt"),
		tlsKey:    filepath.Join(dir, "apiserver.key"),
		saKey:     filepath.Join(dir, "service-account.key"),
		tokenFile: tokenFile,
		token:     token,
	}, nil
}

func ecKeyPEM(key *ecdsa.PrivateKey) ([]byte, error) {
	der, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return nil, err
	}
	return pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: der}), nil
}

// writeKubeconfig writes a kubeconfig for server with the admin token, as
// kubectl and kube-client read it, and returns its path.
func writeKubeconfig(dir, server string, c *credentials) (string, error) {
	path := filepath.Join(dir, "kubeconfig")
	config := fmt.Sprintf(`apiVersion: v1
kind: Config
clusters:
- name: test-cluster
  cluster:
    server: %s
    certificate-authority-data: %s
users:
- name: admin
  user:
    token: %s
contexts:
- name: test-cluster
  context:
    cluster: test-cluster
    user: admin
    namespace: default
current-context: test-cluster
`, server, base64.StdEncoding.EncodeToString(c.caPEM), c.token)
	return path, os.WriteFile(path, []byte(config), 0o600)
}
