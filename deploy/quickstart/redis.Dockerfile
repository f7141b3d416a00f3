# Stand-in for redis:7-alpine where Docker Hub is out of reach (deploy/quickstart-check.sh builds it
# only when no image of that name is present): Debian bookworm's redis-server 7.0, run as the redis
# user in /data as the official image does. Like the official image's entrypoint, redis-server gets
# --protected-mode no (appended after the arguments; a config file, always the first one, still
# works), so the other containers of the compose network can connect: protected mode answers only
# loopback when no password is set.
ARG DEBIAN_BASE=local/bookworm:min
FROM ${DEBIAN_BASE}
RUN apt-get update \
    && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends redis-server \
    && rm -rf /var/lib/apt/lists/* \
    && mkdir -p /data && chown redis:redis /data
WORKDIR /data
USER redis
EXPOSE 6379
ENTRYPOINT ["sh", "-c", "if [ \"$1\" = redis-server ]; then set -- \"$@\" --protected-mode no; fi; exec \"$@\"", "entrypoint"]
CMD ["redis-server"]
