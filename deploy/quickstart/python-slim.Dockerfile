# Stand-in for python:3.11-slim where Docker Hub is out of reach (deploy/quickstart-check.sh builds
# it only when no image of that name is present): Debian bookworm's Python 3.11 in a virtual
# environment first on PATH, so `python` and `pip` install into it as they do in the official image
# (bookworm's own pip refuses system installs, PEP 668). The base is a debootstrap'd bookworm.
# host-ca.crt: the CA bundle the host's pip is configured with (a TLS-inspecting proxy's CA, a
# corporate CA), or empty for the system's; pip in this image and in images built on it uses it.
ARG DEBIAN_BASE=local/bookworm:min
FROM ${DEBIAN_BASE}
COPY host-ca.crt /etc/ssl/certs/host-ca-bundle.crt
RUN apt-get update \
    && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends python3 python3-venv ca-certificates \
    && rm -rf /var/lib/apt/lists/* \
    && python3 -m venv /usr/local/python \
    && ([ -s /etc/ssl/certs/host-ca-bundle.crt ] || cp /etc/ssl/certs/ca-certificates.crt /etc/ssl/certs/host-ca-bundle.crt)
ENV PATH=/usr/local/python/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    LANG=C.UTF-8 PIP_CERT=/etc/ssl/certs/host-ca-bundle.crt
CMD ["python3"]
