<?php

/**
 * Defines the two settings of the gorge-webhook hand-over. Setting
 * gorge.webhook.uri is the switch: see GorgeWebhookDelegation.
 */
final class GorgeWebhookConfigOptions
  extends PhabricatorApplicationConfigOptions {

  public function getName() {
    return pht('Webhook Delivery (gorge)');
  }

  public function getDescription() {
    return pht('Hand Herald webhook delivery over to gorge-webhook.');
  }

  public function getIcon() {
    return 'fa-cloud-upload';
  }

  public function getGroup() {
    return 'apps';
  }

  public function getKey() {
    return 'gorge-webhook';
  }

  public function getApplicationClassName() {
    return 'PhabricatorHeraldApplication';
  }

  public function getOptions() {
    $uri_help = $this->deformat(pht(<<<EOTEXT
Base URI of the gorge-webhook service (its status port), for example
`http://gorge-webhook.phorge.svc:8160`.

Setting this **turns webhook delivery over to gorge-webhook**: Phorge keeps
deciding which hooks fire and keeps writing each request as a "queued" row,
but it hands the row over (marks it in its properties) and stops scheduling
`HeraldWebhookWorker` daemon tasks; a task queued before the switch hands
its request over when it runs, without sending anything. gorge-webhook
sends only requests handed over to it. If gorge-webhook is not running,
they wait in "queued" until it is.

This needs the gorge hand-over patch (`compat/phorge/apply.sh` in the gorge
repository); without it Phorge goes on delivering everything itself and
gorge-webhook sends nothing. Setup checks probe `/readyz` at this address
and report when the service is not ready.

While `phabricator.silent` is on, Phorge keeps its own delivery path (it
marks requests as failed in silent mode), whatever this says.

Leave it empty (the default) for Phorge's own delivery.
EOTEXT
      ));

    $token_help = $this->deformat(pht(<<<EOTEXT
The token gorge-webhook expects for its diagnostic endpoints
(`/api/webhook/stats`, `/api/webhook/hooks`), i.e. the service's
`GORGE_SERVICE_TOKEN`. Setup checks use it to read the service's queue
counts. It does not affect delivery; leave it empty when the service runs
without a token.
EOTEXT
      ));

    return array(
      $this->newOption(GorgeWebhookDelegation::URI_KEY, 'string', null)
        ->setSummary(
          pht(
            'Hand webhook delivery to gorge-webhook: Phorge stops '.
            'delivering webhooks itself.'))
        ->setDescription($uri_help)
        ->addExample('http://gorge-webhook.phorge.svc:8160', pht('Helm'))
        ->addExample('http://gorge-webhook:8160', pht('Compose')),
      $this->newOption(GorgeWebhookDelegation::TOKEN_KEY, 'string', null)
        ->setHidden(true)
        ->setSummary(pht('Token for gorge-webhook\'s diagnostic endpoints.'))
        ->setDescription($token_help),
    );
  }

  protected function didValidateOption(
    PhabricatorConfigOption $option,
    $value) {

    if ($option->getKey() !== GorgeWebhookDelegation::URI_KEY) {
      return;
    }

    if (!phutil_nonempty_string($value)) {
      return;
    }

    $uri = new PhutilURI($value);
    $protocol = $uri->getProtocol();
    if ($protocol !== 'http' && $protocol !== 'https') {
      throw new PhabricatorConfigValidationException(
        pht(
          'Option "%s" must be an "http://" or "https://" URI, got "%s".',
          $option->getKey(),
          $value));
    }

    if (!phutil_nonempty_string($uri->getDomain())) {
      throw new PhabricatorConfigValidationException(
        pht(
          'Option "%s" must name a host, got "%s".',
          $option->getKey(),
          $value));
    }
  }

}
