<?php

/**
 * Setup check for the gorge-webhook hand-over. Runs only when
 * gorge.webhook.uri is set; then it tells the operator when
 * gorge-webhook is not ready (requests wait; its reason says why, e.g. that
 * it sees nothing handed over), when the patch is missing (Phorge delivers
 * everything itself), and when silent mode is on while the service runs.
 * It only reports; nothing waits on it.
 */
final class GorgeWebhookSetupCheck extends PhabricatorSetupCheck {

  public function getDefaultGroup() {
    return self::GROUP_IMPORTANT;
  }

  protected function executeChecks() {
    $uri = GorgeWebhookDelegation::getServiceURI();
    if ($uri === null) {
      return;
    }

    $probe = new GorgeWebhookServiceProbe(
      $uri,
      GorgeWebhookDelegation::getServiceToken());
    $readiness = $probe->probeReadiness();

    if (!GorgeWebhookDelegation::areGuardsInstalled()) {
      $this->raiseGuardsMissing($uri, $readiness);
      return;
    }

    if (!GorgeWebhookDelegation::isDeliveryDelegated()) {
      // With the URI set, only silent mode turns delegation off.
      if ($readiness['reachable']) {
        $this->raiseSilentWhileRunning($uri);
      }
      return;
    }

    if (!$readiness['ready']) {
      $this->raiseNotReady($uri, $readiness['reason']);
      return;
    }

    if (GorgeWebhookDelegation::getServiceToken() !== null) {
      $counts = $probe->fetchQueueCounts();
      if ($counts['reason'] !== null) {
        $this->newIssue('gorge.webhook.stats')
          ->setName(pht('gorge-webhook Diagnostics Unavailable'))
          ->setSummary(pht('Could not read gorge-webhook\'s queue counts.'))
          ->setMessage(
            pht(
              'gorge-webhook is ready and delivers webhooks, but its '.
              'diagnostic endpoint did not answer as expected: %s',
              $counts['reason']))
          ->addPhabricatorConfig(GorgeWebhookDelegation::TOKEN_KEY);
      }
    }
  }

  private function raiseGuardsMissing($uri, array $readiness) {
    if ($readiness['reachable']) {
      $state = pht('gorge-webhook answers at %s', $uri);
    } else {
      $state = pht(
        'gorge-webhook does not answer at %s (%s)',
        $uri,
        $readiness['reason']);
    }

    $this->newIssue('gorge.webhook.guards-missing')
      ->setName(pht('gorge Patch Missing: Phorge Delivers Webhooks Itself'))
      ->setSummary(
        pht(
          '"%s" is set, but this Phorge hands no webhook request over to '.
          'gorge-webhook.',
          GorgeWebhookDelegation::URI_KEY))
      ->setMessage(
        pht(
          '"%s" is set, but version %d of the gorge hand-over patch is not '.
          'in %s (a Phorge upgrade may have replaced the patched files, or '.
          'an older kit is applied). Phorge goes on delivering every webhook '.
          'request itself and hands none over; %s, and sends only requests '.
          'handed over to it, so it sends none of them. Nothing is sent '.
          'twice.'.
          "\n\n".
          'Re-apply the patch with "compat/phorge/apply.sh <phorge root>" '.
          'from the gorge repository (for an older kit, its revert.sh first) '.
          'and restart PHP and the daemons, or clear "%s".',
          GorgeWebhookDelegation::URI_KEY,
          GorgeWebhookDelegation::GUARD_VERSION,
          implode(', ', GorgeWebhookDelegation::getGuardedClasses()),
          $state,
          GorgeWebhookDelegation::URI_KEY))
      ->addPhabricatorConfig(GorgeWebhookDelegation::URI_KEY);
  }

  private function raiseSilentWhileRunning($uri) {
    $this->newIssue('gorge.webhook.silent')
      ->setName(pht('gorge-webhook Runs While Phorge Is Silent'))
      ->setSummary(
        pht(
          'Silent mode is on, but gorge-webhook is running and may still '.
          'send webhooks handed over before.'))
      ->setMessage(
        pht(
          '"%s" is on, so Phorge hands no new webhook request over and marks '.
          'each one as failed in silent mode. But gorge-webhook answers at '.
          '%s: it cannot see silent mode, and still sends the requests that '.
          'were handed over to it before silent mode was turned on. Stop '.
          'gorge-webhook while silent mode is on if those must not go out '.
          'either.',
          'phabricator.silent',
          $uri))
      ->addPhabricatorConfig('phabricator.silent')
      ->addPhabricatorConfig(GorgeWebhookDelegation::URI_KEY);
  }

  private function raiseNotReady($uri, $reason) {
    $this->newIssue('gorge.webhook.not-ready')
      ->setName(pht('gorge-webhook Is Not Ready'))
      ->setSummary(
        pht(
          'Webhook delivery is handed to gorge-webhook, which is not ready; '.
          'webhook requests wait.'))
      ->setMessage(
        pht(
          'Webhook delivery is handed over to gorge-webhook at %s ("%s"), '.
          'but the service is not ready: %s'.
          "\n\n".
          'Nothing is lost: requests stay queued and are delivered, oldest '.
          'first, once the service is ready. Until then no webhook is '.
          'sent. Check that gorge-webhook is running and can reach this '.
          'Phorge\'s database (its /readyz reason names the problem).',
          $uri,
          GorgeWebhookDelegation::URI_KEY,
          $reason))
      ->addPhabricatorConfig(GorgeWebhookDelegation::URI_KEY);
  }

}
